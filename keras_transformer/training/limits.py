"""Where a run stops short of its `train_steps`: after so many epochs of
its data (`--max-epochs`), or after so long (`--max-time`, as a job's time
limit asks), at an update's end, with a checkpoint it resumes from."""

import math
import re
import time

import keras

from keras_transformer.training.trainer import batches_per_update

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")
_UNITS = (86400, 3600, 60, 1)


def parse_duration(text):
    """Seconds of a duration such as `90m`, `2h30m`, `1d`, `45s` or `3600`.

    Raises:
        ValueError: for anything else, zero and negative durations included.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.fullmatch(str(text).strip().lower())
        if not str(text).strip() or match is None or not any(match.groups()):
            raise ValueError(f"expected a duration such as 90m, 2h30m or 3600 (seconds); received {text!r}")
        seconds = sum(float(value) * unit for value, unit in zip(match.groups(), _UNITS) if value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"expected a duration above zero; received {text!r}")
    return seconds


def steps_in_epochs(epochs, batches_per_epoch, accumulate=1):
    """The updates of `epochs` passes over the data, the last one partial
    where an epoch is not a whole number of updates."""
    return math.ceil(epochs * batches_per_epoch / accumulate)


class StopAfter(keras.callbacks.Callback):
    """Stops training once `seconds` have passed since training began (in
    this process: a resumed run has the time again), where an update ends.

    The clock is read before each call of the train function, on the main
    thread (no wait for the device), and the run stops after the call that
    ends an update; `fit` then writes a checkpoint there.

    Args:
        seconds: the time allowed.
        log: where the stop's line goes.
        agree: for several processes, a collective giving the least of
            every process's integer; then the clock is read every `every`
            updates only, and all stop where any one's time is up.
        every: see `agree`.
    """

    def __init__(self, seconds, log=print, agree=None, every=100):
        super().__init__()
        self.seconds = seconds
        self.log = log
        self.agree = agree
        self.every = every
        self.stopped_at = None
        self._began = None

    def on_train_begin(self, logs=None):
        if self._began is None:  # `fit` may call Keras's several times
            self._began = time.monotonic()
        self._per_update = batches_per_update(self.model)
        self._per_call = getattr(self.model, "steps_per_execution", 1) or 1

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_train_batch_begin(self, batch, logs=None):
        done = batch + self._per_call  # batches of the epoch when this call ends
        if done % self._per_update:
            return  # the call ends inside an update
        step = self._epoch_start + done // self._per_update
        if self.agree is not None and step % self.every:
            return
        late = time.monotonic() - self._began >= self.seconds
        if self.agree is not None:
            late = self.agree(0 if late else 1) == 0
        if late:
            self.model.stop_training = True
            self.stopped_at = step
            self.log(f"stopping at step {step}: the run's time is up ({self.seconds:.0f} s); resume with --resume")
