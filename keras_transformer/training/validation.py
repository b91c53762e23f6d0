"""Validation at each checkpoint: the losses Keras computes, and BLEU and
chrF of the model's translations with the search it will translate with."""

import json
import os
import time

import keras
import numpy as np
import sacrebleu.metrics

from keras_transformer.files import write_atomically
from keras_transformer.training.board import translations_table
from keras_transformer.training.progress import read_history

# Each validation metric: its key in Keras's logs and in history.jsonl, and
# whether a higher value is better.
VALID_METRICS = {
    "loss": ("val_loss", False),
    "perplexity": ("val_perplexity", False),
    "bleu": ("val_bleu", True),
    "chrf": ("val_chrf", True),
}
DEFAULT_VALID_METRICS = ("loss", "perplexity", "bleu")
# The metrics scored on translations, by sacreBLEU.
SCORERS = {"bleu": sacrebleu.metrics.BLEU, "chrf": sacrebleu.metrics.CHRF}


def check_metrics(names, what="valid_metrics"):
    """`names` as a tuple, or ValueError naming the unknown ones."""
    names = tuple(names)
    unknown = [name for name in names if name not in VALID_METRICS]
    if unknown or not names:
        raise ValueError(f"{what} must name some of {list(VALID_METRICS)}; received {list(names)}.")
    return names


class Validation(keras.callbacks.Callback):
    """Scores the model at the end of every epoch (one checkpoint interval
    in `keras_transformer.training.fit`) and records the scores.

    Keras's validation gives the loss and perplexity (`val_loss`,
    `val_perplexity`); for BLEU and chrF this translates `sources` with
    `translator` (its search: beam size and length penalty) and scores the
    translations against `references` with sacreBLEU. They go into the
    epoch's logs (`val_bleu`, `val_chrf`), so that the callbacks after it
    (TensorBoard, the choice of the best checkpoint) see them, and into a
    JSON line of `history_path` with the step, the time trained, the
    sacreBLEU signatures and the search.

    Args:
        translator: a `Translator` of the model being trained; reused, so
            its search is compiled once. When `fit` resumes from a
            checkpoint, it is rebuilt around the restored model.
        sources: validation source sentences.
        references: their reference translations.
        metrics: which of `VALID_METRICS` to record and show.
        history_path: the JSON-lines file of the validation curve, or None.
        log: where a line per checkpoint goes.
        board: a `Board` for a few of the translations, or None.
        shown: how many translations go to the board.
    """

    def __init__(
        self, translator, sources, references, metrics=DEFAULT_VALID_METRICS,
        history_path=None, log=print, board=None, shown=3,
    ):
        super().__init__()
        self.translator = translator
        self.sources = list(sources)
        self.references = list(references)
        self.metrics = check_metrics(metrics)
        self.history_path = history_path
        self.log = log
        self.board = board
        self.shown = shown

    def on_train_begin(self, logs=None):
        self._start = time.time()
        self._elapsed_before = 0.0
        if self.history_path and os.path.isfile(self.history_path):
            # A resumed run continues the clock of the run it resumes.
            records = read_history(self.history_path)
            if records:
                self._elapsed_before = records[-1]["train_seconds"]

    def on_epoch_begin(self, epoch, logs=None):
        self._interval_start = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        train_seconds = self._elapsed_before + time.time() - self._start
        record = {"step": step, "train_seconds": round(train_seconds, 1)}
        for key in ("loss", "val_loss", "val_perplexity", "val_masked_token_accuracy"):
            if key in logs:
                record[key] = float(logs[key])
        if "target_tokens" in logs and step > self._interval_start:
            record["tokens_per_update"] = round(float(logs["target_tokens"]) / (step - self._interval_start), 1)
        scored = [name for name in self.metrics if name in SCORERS]
        if self.sources and scored:
            start = time.time()
            hypotheses = self._translator().translate(self.sources)
            for name in scored:
                scorer = SCORERS[name]()
                score = scorer.corpus_score(hypotheses, [self.references]).score
                logs[f"val_{name}"] = score
                record[f"val_{name}"] = round(score, 2)
                record[f"{name}_signature"] = str(scorer.get_signature())
            record["search"] = self._search()
            record["valid_seconds"] = round(time.time() - start, 1)
            if self.board is not None:
                shown = slice(0, self.shown)
                table = translations_table(self.sources[shown], hypotheses[shown], self.references[shown])
                self.board.text(step, "valid/translations", table)
        # The next interval's clock leaves the validation time out.
        self._start += record.get("valid_seconds", 0.0)
        if self.history_path:
            # Rewritten whole, atomically, and before the step's checkpoint
            # (`fit` writes that last): an interval a kill made the run redo
            # replaces its record.
            earlier = read_history(self.history_path) if os.path.isfile(self.history_path) else []
            lines = [json.dumps(r) + "\n" for r in earlier if r["step"] < step]
            write_atomically(self.history_path, "".join(lines) + json.dumps(record) + "\n")
        self.log(" | ".join([f"checkpoint at step {step}"] + self._shown(record)))

    def _translator(self):
        if self.translator.model is not self.model:
            # `fit` resumed from a checkpoint, which is a new model object:
            # translate with the model being trained, not with the one the
            # translator was given before the restore.
            self.translator = type(self.translator)(
                self.model, self.translator.tokenizer, **self.translator.get_config()
            )
        return self.translator

    def _search(self):
        config = self.translator.get_config()
        beam = config.get("beam_size", 1)
        return "greedy" if beam == 1 else f"beam {beam}, alpha {config.get('alpha')}"

    def _shown(self, record):
        shown = []
        if "val_loss" in record and "loss" in self.metrics:
            shown.append(f"valid loss {record['val_loss']:.3f}")
        if "val_perplexity" in record and "perplexity" in self.metrics:
            shown.append(f"perplexity {record['val_perplexity']:.2f}")
        if "val_bleu" in record:
            shown.append(f"BLEU {record['val_bleu']:.2f}")
        if "val_chrf" in record:
            shown.append(f"chrF {record['val_chrf']:.2f}")
        if "search" in record:
            shown.append(f"{record['search']} on {len(self.sources)} sentences")
        return shown


# The name of earlier versions, which scored greedy BLEU only.
ValidationBLEU = Validation


def validation_score(model, metric, valid_data=None, translator=None, sources=(), references=(), label_smoothing=0.1):
    """`model`'s validation `metric`, computed here: the loss (label
    smoothed) or perplexity over `valid_data`'s real tokens, or BLEU or
    chrF of `translator`'s search (its settings, around `model`) on
    `sources`. For a model outside training, such as the weights' moving
    average, which Keras's validation did not see."""
    if metric in SCORERS:
        search = type(translator)(model, translator.tokenizer, **translator.get_config())
        hypotheses = search.translate(list(sources))
        return SCORERS[metric]().corpus_score(hypotheses, [list(references)]).score
    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.losses import label_negative_log_likelihood

    smoothed = LabelSmoothedCrossEntropy(label_smoothing, reduction="none")
    total = negative_log_likelihood = tokens = 0.0
    for index in range(len(valid_data)):
        inputs, labels = valid_data[index][:2]
        logits = model(inputs, training=False)
        real = keras.ops.convert_to_numpy(labels) != 0
        count = float(real.sum())
        # The loss's values weigh each real token by positions / real tokens.
        total += float(keras.ops.convert_to_numpy(smoothed(labels, logits)).sum()) * count / real.size
        negative_log_likelihood += float((keras.ops.convert_to_numpy(label_negative_log_likelihood(labels, logits)) * real).sum())
        tokens += count
    if metric == "loss":
        return total / max(tokens, 1.0)
    return float(np.exp(negative_log_likelihood / max(tokens, 1.0)))
