"""What a long run shows while it trains: log lines, the training curve,
and the validation history's reader."""

import csv
import json
import os
import threading
import time

import keras

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
    if isinstance(rate, dict):  # a serialized schedule, which counts batches
        batches = step * (getattr(optimizer, "gradient_accumulation_steps", None) or 1)
        rate = keras.optimizers.schedules.deserialize(rate)(batches)
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
        board: a `Board` that takes each line's numbers too, or None.
    """

    def __init__(self, train_steps, every=100, log=print, curve_path=None, board=None):
        super().__init__()
        self.train_steps = train_steps
        self.every = every
        self.log = log
        self.curve_path = curve_path
        self.board = board
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
            due = step % self.every == 0 or step == self.train_steps
            if step > self._last_step and due and self.ends_update(batch):
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
            parts.append(f"{(tokens - self._last_tokens) / max(step - self._last_step, 1):,.0f} tok/update")
        parts += [f"loss {loss:.3f}", f"lr {rate:.1e}"]
        if steps_per_second > 0 and step < self.train_steps:
            parts.append(f"ETA {format_duration((self.train_steps - step) / steps_per_second)}")
        self.log(" | ".join(parts))
        if self.curve_path:
            with open(self.curve_path, "a") as curve:
                row = (step, loss, rate, steps_per_second, tokens_per_second)
                curve.write(",".join(repr(value) for value in row) + "\n")
        if self.board is not None:
            self.board.scalars(step, {
                "train/loss": loss, "train/learning_rate": rate, "train/steps_per_second": steps_per_second,
                **({"train/tokens_per_second": tokens_per_second} if "target_tokens" in logs else {}),
                # The last update's, before clipping (optimizers.Adam(record_gradient_norm=True)).
                **({"train/gradient_norm": float(logs["gradient_norm"])} if "gradient_norm" in logs else {}),
            })
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


def read_history(path):
    """The records `Validation` wrote, the newest per step, by step."""
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

