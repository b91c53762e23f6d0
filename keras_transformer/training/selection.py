"""Choosing the model by validation: the best checkpoints kept apart, and
early stopping (fairseq's `--best-checkpoint-metric`, `--keep-best-checkpoints`
and `--patience`; Marian's `--early-stopping`).

Everything this decides follows from `history.jsonl`, which the validation
writes before each checkpoint: a resumed run reads the best so far and the
validations since then from the records up to the step it resumes from, so
a kill at any moment loses neither.
"""

import contextlib
import os
import shutil

import keras

from keras_transformer.files import PARTIAL_PREFIX
from keras_transformer.files import remove
from keras_transformer.training.checkpoints import CHECKPOINT_PATTERN
from keras_transformer.training.checkpoints import checkpoint_step
from keras_transformer.training.checkpoints import list_checkpoints
from keras_transformer.training.progress import read_history
from keras_transformer.training.validation import VALID_METRICS

# Where the best checkpoints are kept, inside the checkpoint directory.
BEST_DIR = "best"


class Standing:
    """The best validations of a run so far, by one metric.

    Args:
        records: the validation records (`read_history`), by step.
        metric: one of `VALID_METRICS`.
    """

    def __init__(self, records, metric):
        self.metric = metric
        self.key, self.higher_is_better = VALID_METRICS[metric]
        self.scores = {r["step"]: r[self.key] for r in records if self.key in r}
        self.steps = [r["step"] for r in records if self.key in r]

    def ranked(self):
        """The scored steps, best first; the earlier step first at a tie."""
        sign = -1.0 if self.higher_is_better else 1.0
        return sorted(self.steps, key=lambda step: (sign * self.scores[step], step))

    @property
    def best_step(self):
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def since_best(self):
        """Validations after the best one, none of them better."""
        best = self.best_step
        return 0 if best is None else sum(step > best for step in self.steps)

    def describe(self, step=None):
        step = self.best_step if step is None else step
        return f"step {step} ({self.metric} {self.scores[step]:.2f})"


def standing(history_path, metric, up_to=None):
    """The `Standing` of the validations in `history_path` up to step
    `up_to` (those after it are of steps a resumed run trains again)."""
    records = read_history(history_path) if history_path and os.path.isfile(history_path) else []
    return Standing([r for r in records if up_to is None or r["step"] <= up_to], metric)


def best_checkpoints(checkpoint_dir):
    """The checkpoints kept as the best, by step."""
    return list_checkpoints(os.path.join(checkpoint_dir, BEST_DIR))


class BestCheckpoints(keras.callbacks.Callback):
    """Keeps the `keep` best checkpoints by `metric` in `checkpoints/best/`,
    apart from the rotation of the last ones, and stops training after
    `patience` validations without a better score.

    It runs after each checkpoint is written (`fit(..., selection=...)`),
    and reads the scores from the validation's history. The best are hard
    links of the checkpoints (copies where links cannot be made), so the
    rotation's removals leave them whole.

    Args:
        checkpoint_dir: the run's `checkpoints/` folder.
        history_path: the run's `history.jsonl`.
        metric: one of `VALID_METRICS`.
        keep: how many of the best checkpoints to keep.
        patience: stop after this many validations without improvement;
            None: never.
        log: where the stop's line goes.
        write: False in a process of the run that neither writes the
            checkpoints nor decides (another process of the run does).
        agree: for a run of several processes, a collective that gives
            the least of every process's integer; each process calls it at
            each validation, so that all stop at the same update.
    """

    def __init__(self, checkpoint_dir, history_path, metric, keep=1, patience=None, log=print, write=True, agree=None):
        super().__init__()
        if metric not in VALID_METRICS:
            raise ValueError(f"metric must be one of {list(VALID_METRICS)}; received {metric!r}.")
        self.checkpoint_dir = checkpoint_dir
        self.history_path = history_path
        self.metric = metric
        self.keep = keep
        self.patience = patience
        self.log = log
        self.write = write
        self.agree = agree
        self.stopped_at = None

    @property
    def best_dir(self):
        return os.path.join(self.checkpoint_dir, BEST_DIR)

    def on_train_begin(self, logs=None):
        if self.write:
            self._keep_best(int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)))

    def on_epoch_end(self, epoch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        current = self._keep_best(step) if self.write else None
        stop = current is not None and step in current.scores and self.exhausted(current)
        if self.agree is not None:
            stop = self.agree(0 if stop else 1) == 0  # the deciding process's word
        if stop:
            self.stopped_at = step
            self.model.stop_training = True
            self.log(
                f"early stopping at step {step}: no better valid {self.metric} in {self.patience} validations"
                + (f"; the best is {current.describe()}" if current is not None else "")
            )

    def exhausted(self, current):
        return self.patience is not None and current.best_step is not None and current.since_best() >= self.patience

    def _keep_best(self, step):
        """Makes `best/` hold the best `keep` checkpoints of the validations
        up to `step`: links the missing ones (a kill may have come between
        a checkpoint and its link) and removes the others (no longer among
        the best, or of steps past `step`, which this run trains again)."""
        current = standing(self.history_path, self.metric, up_to=step)
        wanted = set(current.ranked()[: self.keep])
        os.makedirs(self.best_dir, exist_ok=True)
        for path in best_checkpoints(self.checkpoint_dir):
            if checkpoint_step(path) not in wanted:
                os.remove(path)
        for name in os.listdir(self.best_dir):
            if name.startswith(PARTIAL_PREFIX):
                remove(os.path.join(self.best_dir, name))
        for wanted_step in sorted(wanted):
            name = CHECKPOINT_PATTERN.format(step=wanted_step)
            kept, source = os.path.join(self.best_dir, name), os.path.join(self.checkpoint_dir, name)
            if not os.path.exists(kept) and os.path.exists(source):
                _link(source, kept)
        return current


def _link(source, target):
    """`target` as a hard link of `source`, else a copy; whole or absent
    after a kill (the copy is renamed into place)."""
    try:
        os.link(source, target)
        return
    except OSError:
        pass
    partial = os.path.join(os.path.dirname(target), PARTIAL_PREFIX + os.path.basename(target))
    shutil.copyfile(source, partial)
    with contextlib.suppress(FileNotFoundError):
        os.replace(partial, target)
