"""The translator a training run saves, and what it validates with: the
average of the last checkpoints, the best ones by a validation metric, or
the moving average of the weights where it validates better; and the
search of the validation's translations."""

import json
import os

import keras

from keras_transformer.data.corpus import read_json_object
from keras_transformer.decoding.translator import CONFIG_FILE as TRANSLATOR_CONFIG_FILE
from keras_transformer.decoding.translator import Translator
from keras_transformer.files import write_atomically
from keras_transformer.training.checkpoints import checkpoint_step
from keras_transformer.training.checkpoints import list_checkpoints
from keras_transformer.training.distribution import local_reads
from keras_transformer.training.progress import read_history
from keras_transformer.training.selection import best_checkpoints
from keras_transformer.training.selection import standing
from keras_transformer.training.validation import VALID_METRICS
from keras_transformer.training.validation import validation_score


def final_checkpoints(config, checkpoint_dir, history_path):
    """The checkpoints the translator averages, and how they were chosen:
    the last `average`, or the best by `best_metric`."""
    if config.best_metric is None:
        last = config.last_averaged()
        kept = list_checkpoints(checkpoint_dir)[-last:]
        return kept, f"the average of the last {len(kept)} checkpoint{'s' * (len(kept) > 1)}"
    with local_reads():
        ranked = standing(history_path, config.best_metric).ranked()
    best = {checkpoint_step(path): path for path in best_checkpoints(checkpoint_dir)}
    kept = [best[step] for step in ranked if step in best][: config.average_best or 1]
    if not kept:
        raise ValueError(
            f"No best checkpoint by {config.best_metric} in {os.path.join(checkpoint_dir, 'best')}: "
            f"the run validated no {config.best_metric} ({history_path}) before its end."
        )
    scores = standing(history_path, config.best_metric)
    what = ", ".join(scores.describe(checkpoint_step(path)) for path in kept)
    if len(kept) == 1:
        return kept, f"the best checkpoint by valid {config.best_metric}, {what}"
    return kept, f"the average of the {len(kept)} best checkpoints by valid {config.best_metric}: {what}"


def record_translator(history_path, how, kept):
    """Says in the history which checkpoints the saved translator holds:
    a `translator` entry in the last record."""
    records = read_history(history_path) if os.path.isfile(history_path) else []
    if not records:
        return
    records[-1]["translator"] = {"chosen": how, "checkpoints": [os.path.basename(p) for p in kept]}
    write_atomically(history_path, "".join(json.dumps(r) + "\n" for r in records))


def better_of_moving_average(config, final, kept, how, checkpoint_dir, valid, valid_data, tokenizer, log):
    """`(model, checkpoints, how)` of the translator: `final` (chosen as
    `how` says), or the moving average of the weights (`--ema`) at the
    newest checkpoint where it scores better on validation, by
    `best_metric` or else the loss."""
    newest = list_checkpoints(checkpoint_dir)[-1]
    with local_reads():
        averages = keras.saving.load_model(newest).optimizer
    averages = getattr(averages, "inner_optimizer", averages).moving_averages()
    if not averages:
        return final, kept, how
    smoothed = type(final).from_config(final.get_config())
    smoothed.set_weights(final.get_weights())
    for variable, average in zip(smoothed.trainable_variables, averages):
        variable.assign(average)
    metric = config.best_metric or "loss"
    translator = validation_translator(config, final, tokenizer)
    sentences = slice(0, config.valid_bleu_sentences)
    scores = [
        validation_score(
            candidate, metric, valid_data, translator, valid.sources[sentences], valid.targets[sentences],
            config.label_smoothing,
        )
        for candidate in (final, smoothed)
    ]
    higher = VALID_METRICS[metric][1]
    better = scores[1] > scores[0] if higher else scores[1] < scores[0]
    log(
        f"valid {metric}: {scores[0]:.3f} for {how}, {scores[1]:.3f} for the moving average of the weights "
        f"(--ema {config.ema}) at {os.path.basename(newest)}; the translator is the "
        + ("moving average" if better else "former")
    )
    if not better:
        return final, kept, how
    return smoothed, [newest], f"the moving average of the weights (--ema {config.ema}) at the newest checkpoint, valid {metric} {scores[1]:.2f} against {scores[0]:.2f}"


def validation_translator(config, model, tokenizer):
    """The translator of the model being trained that validation
    translates with: the saved translator's search unless told another."""
    return Translator(
        model, tokenizer, beam_size=config.valid_beam_size or config.beam_size,
        alpha=config.alpha if config.valid_alpha is None else config.valid_alpha,
        max_source_length=config.max_tokens, max_extra_length=config.max_extra_length,
        length_penalty=length_penalty(config),
    )


def length_penalty(config):
    """The started-from translator's form of the length penalty (a
    converted one's is its own tools'), or the paper's."""
    path = os.path.join(config.init_from or "", TRANSLATOR_CONFIG_FILE)
    return read_json_object(path).get("length_penalty", "gnmt") if config.init_from and os.path.isfile(path) else "gnmt"


def languages(config):
    """The run's language pair, else the started-from translator's, else None."""
    if config.source_language and config.target_language:
        return config.source_language, config.target_language
    path = os.path.join(config.init_from or "", TRANSLATOR_CONFIG_FILE)
    return read_json_object(path).get("languages") if config.init_from and os.path.isfile(path) else None
