"""What a long run shows while it trains: log lines and validation BLEU."""

import csv
import json
import os
import threading
import time

import keras
import sacrebleu.metrics

from keras_transformer.files import write_atomically
from keras_transformer.training.step_hooks import StepHook


def format_duration(seconds):
    """`1h05m`, `3m20s` or `42s`."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def current_learning_rate(optimizer, step):
    """The rate of the update after `step` updates, as a float.

    Calls the schedule, as the optimizer's config gives it, with a plain
    step: `optimizer.learning_rate` passes the step variable itself, which
    the JAX backend cannot trace inside `fit`.
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # loss scaling
    rate = optimizer.get_config()["learning_rate"]
    if isinstance(rate, dict):  # a serialized schedule
        rate = keras.optimizers.schedules.deserialize(rate)(step)
    return float(keras.ops.convert_to_numpy(rate))


class ProgressLog(StepHook):
    """Steady log lines: step, steps/s, target tokens/s, loss, rate, ETA.

        step 1200/3000 | 0.48 steps/s | 1,730 tok/s | loss 3.412 | lr 4.9e-04 | ETA 1h02m

    Speeds cover the steps since the previous line, so the first line of a
    run (or of a resumed run) includes compiling. Tokens are the non-padding
    target tokens, read from the `target_tokens` metric when the model is
    compiled with `keras_transformer.metrics.TargetTokens`
    (`compile_model(..., count_tokens=True)`, as `train` compiles).

    Keras may run it on a thread of its own once each step's logs are on
    the host (`StepHook`), so the steps do not wait for their logs: a line's
    time is when its step's logs were there.

    With `curve_path`, each line is also a row of a CSV file (`CURVE_COLUMNS`),
    which any backend writes and any tool reads, TensorFlow or not. A
    resumed run first drops the rows past the step it resumed from.

    Args:
        train_steps: the run's total number of steps, for the ETA.
        every: a line every this many steps.
        log: where lines go, such as `print`.
        curve_path: the CSV file of the training curve, or None.
    """

    def __init__(self, train_steps, every=100, log=print, curve_path=None):
        super().__init__()
        self.train_steps = train_steps
        self.every = every
        self.log = log
        self.curve_path = curve_path
        self._turns = threading.Condition()

    def on_train_begin(self, logs=None):
        self._steps_per_call = getattr(self.model, "steps_per_execution", 1) or 1
        self._last_time = time.perf_counter()
        self._last_step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        self._last_tokens = 0.0
        if self.curve_path:
            rows = [row for row in read_curve(self.curve_path) if row["step"] <= self._last_step]
            lines = [",".join(CURVE_COLUMNS)] + [",".join(repr(row[c]) for c in CURVE_COLUMNS) for row in rows]
            write_atomically(self.curve_path, "".join(line + "\n" for line in lines))

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        # Keras resets the metrics, so the token count, at each epoch.
        self._last_tokens = 0.0
        self._calls_done = 0  # Keras waits for its threads at an epoch's end

    def on_train_batch_end(self, batch, logs=None):
        step = self.step(batch)
        turn = batch // self._steps_per_call  # this call's place in the epoch
        with self._turns:
            # Keras's threads may run the calls' hooks out of order: each
            # waits for those before it, so lines come in order (the timeout:
            # a hook that never comes, after another callback raised).
            self._turns.wait_for(lambda: self._calls_done >= turn, timeout=10)
            if step > self._last_step and (step % self.every == 0 or step == self.train_steps):
                self._line(step, logs or {})
            self._calls_done = max(self._calls_done, turn + 1)
            self._turns.notify_all()

    def _line(self, step, logs):
        now = time.perf_counter()
        elapsed = max(now - self._last_time, 1e-9)
        steps_per_second = (step - self._last_step) / elapsed
        tokens = float(logs.get("target_tokens", 0.0))
        tokens_per_second = (tokens - self._last_tokens) / elapsed if "target_tokens" in logs else float("nan")
        loss = float(logs.get("loss", float("nan")))
        rate = current_learning_rate(self.trained.optimizer, step)
        parts = [f"step {step}/{self.train_steps}", f"{steps_per_second:.2f} steps/s"]
        if "target_tokens" in logs:
            parts.append(f"{tokens_per_second:,.0f} tok/s")
        parts += [f"loss {loss:.3f}", f"lr {rate:.1e}"]
        if steps_per_second > 0 and step < self.train_steps:
            parts.append(f"ETA {format_duration((self.train_steps - step) / steps_per_second)}")
        self.log(" | ".join(parts))
        if self.curve_path:
            with open(self.curve_path, "a") as curve:
                row = (step, loss, rate, steps_per_second, tokens_per_second)
                curve.write(",".join(repr(value) for value in row) + "\n")
        self._last_time, self._last_step, self._last_tokens = now, step, tokens


CURVE_COLUMNS = ("step", "loss", "learning_rate", "steps_per_second", "target_tokens_per_second")


def read_curve(path):
    """The rows of a `ProgressLog` CSV file, as dicts of numbers; a row a
    kill left half-written is left out."""
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            try:
                rows.append({"step": int(row["step"]), **{c: float(row[c]) for c in CURVE_COLUMNS[1:]}})
            except (TypeError, ValueError):
                continue
    return rows


class ValidationBLEU(keras.callbacks.Callback):
    """BLEU of greedy translations of validation sentences, per checkpoint.

    At the end of every epoch (one checkpoint interval in
    `keras_transformer.training.fit`), translates `sources` greedily with the
    model being trained, scores them against `references` with sacreBLEU,
    adds `val_bleu` to the epoch's logs (so the TensorBoard callback, which
    comes after it, records it), and writes a JSON line with the step, the
    wall-clock time, the losses and the BLEU to `history_path`.

    Args:
        translator: a `Translator` of the model being trained (greedy is
            cheapest); it is reused, so its search is compiled once. When
            `fit` resumes from a checkpoint, it is rebuilt around the
            restored model.
        sources: validation source sentences.
        references: their reference translations.
        history_path: the JSON-lines file of the training curve, or None.
        log: where a line per checkpoint goes.
    """

    def __init__(self, translator, sources, references, history_path=None, log=print):
        super().__init__()
        self.translator = translator
        self.sources = list(sources)
        self.references = list(references)
        self.history_path = history_path
        self.log = log

    def on_train_begin(self, logs=None):
        self._start = time.time()
        self._elapsed_before = 0.0
        if self.history_path and os.path.isfile(self.history_path):
            # A resumed run continues the clock of the run it resumes.
            records = read_history(self.history_path)
            if records:
                self._elapsed_before = records[-1]["train_seconds"]

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        train_seconds = self._elapsed_before + time.time() - self._start
        record = {"step": step, "train_seconds": round(train_seconds, 1)}
        for key in ("loss", "val_loss", "val_perplexity", "val_masked_token_accuracy"):
            if key in logs:
                record[key] = float(logs[key])
        if self.sources:
            if self.translator.model is not self.model:
                # `fit` resumed from a checkpoint, which is a new model
                # object: translate with the model being trained, not with
                # the one the translator was given before the restore.
                self.translator = type(self.translator)(
                    self.model, self.translator.tokenizer, **self.translator.get_config()
                )
            start = time.time()
            hypotheses = self.translator.translate(self.sources)
            bleu = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [self.references])
            logs["val_bleu"] = bleu.score
            record["val_bleu"] = round(bleu.score, 2)
            record["bleu_seconds"] = round(time.time() - start, 1)
        # The next interval's clock leaves the validation time out.
        self._start += record.get("bleu_seconds", 0.0)
        if self.history_path:
            # Rewritten whole, atomically, and before the step's checkpoint
            # (`fit` writes that last): an interval a kill made the run redo
            # replaces its record.
            earlier = read_history(self.history_path) if os.path.isfile(self.history_path) else []
            lines = [json.dumps(r) + "\n" for r in earlier if r["step"] < step]
            write_atomically(self.history_path, "".join(lines) + json.dumps(record) + "\n")
        shown = [f"checkpoint at step {step}"]
        if "val_loss" in record:
            shown.append(f"valid loss {record['val_loss']:.3f}")
        if "val_perplexity" in record:
            shown.append(f"perplexity {record['val_perplexity']:.2f}")
        if "val_bleu" in record:
            shown.append(f"greedy BLEU {record['val_bleu']:.2f} on {len(self.sources)} sentences")
        self.log(" | ".join(shown))


def read_history(path):
    """The records `ValidationBLEU` wrote, the newest per step, by step."""
    records = {}
    with open(path) as file:
        for line in file:
            line = line.strip()
            if line:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
                records[record["step"]] = record
    return [records[step] for step in sorted(records)]

