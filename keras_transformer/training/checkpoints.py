"""Checkpoints every N steps, resumption after a crash, and averaging."""

import contextlib
import glob
import os
import re
import warnings

import keras
import numpy as np

from keras_transformer.checks import describe_error
from keras_transformer.files import PARTIAL_PREFIX
from keras_transformer.files import remove
from keras_transformer.files import save_keras_model
from keras_transformer.training.distribution import local_reads

CHECKPOINT_PATTERN = "ckpt-{step:08d}.keras"
CHECKPOINT_NAME = re.compile(r"ckpt-(\d+)\.keras")
# A checkpoint that cannot be read is moved aside under this prefix, out of
# the resume's way but kept for inspection.
UNREADABLE_PREFIX = ".unreadable-"


def list_checkpoints(directory):
    """The `.keras` checkpoints in `directory`, oldest step first.

    Only names of the form `ckpt-<step>.keras` count: the temporary file of a
    write that a crash cut short, or anything else, is not a checkpoint and
    does not stop a resume.
    """
    paths = glob.glob(os.path.join(directory, "ckpt-*.keras"))
    paths = [path for path in paths if CHECKPOINT_NAME.fullmatch(os.path.basename(path))]
    return sorted(paths, key=checkpoint_step)


def check_writable(directory):
    """Creates `directory` and writes a file in it, or raises a clear error,
    so that a run finds out before its first interval of training."""
    try:
        os.makedirs(directory, exist_ok=True)
        # One fixed name: a kill between these lines leaves one small file,
        # which the next check overwrites and removes.
        probe = os.path.join(directory, ".write-check")
        with open(probe, "w") as file:
            file.write("ok")
        os.remove(probe)
    except OSError as error:
        raise PermissionError(
            f"Checkpoints cannot be written to {directory}: "
            f"{error.strerror or error}. Expected a writable directory."
        ) from None


def checkpoint_step(path):
    """The training step a checkpoint was written at."""
    match = CHECKPOINT_NAME.fullmatch(os.path.basename(path))
    if match is None:
        raise ValueError(
            f"Not a checkpoint name: expected ckpt-<step>.keras. Received: {path}"
        )
    return int(match.group(1))


class SaveCheckpoints(keras.callbacks.Callback):
    """Writes the model with its optimizer state at the end of each epoch.

    `keras_transformer.training.fit` makes an epoch one checkpoint interval,
    so this writes every `checkpoint_every` steps. A checkpoint is written to
    a temporary file and renamed, so a crash mid-write leaves the previous
    checkpoints whole. Only the newest `keep` are kept.

    Args:
        directory: where `ckpt-<step>.keras` files go.
        keep: how many checkpoints to keep (at least the number to average).
    """

    def __init__(self, directory, keep=5):
        super().__init__()
        self.directory = directory
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.directory, exist_ok=True)
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        path = os.path.join(self.directory, CHECKPOINT_PATTERN.format(step=step))
        # This process's copy alone: under a distribution across processes
        # the save's transfers would be collectives, which a run whose first
        # process alone writes (one shared directory) cannot meet.
        with local_reads():
            save_keras_model(self.model, path)
        for old in list_checkpoints(self.directory)[: -self.keep]:
            os.remove(old)
        # Writes that an earlier crash cut short.
        for stale in glob.glob(os.path.join(self.directory, PARTIAL_PREFIX + "ckpt-*")):
            remove(stale)


def newest_readable(directory, stacklevel=2):
    """`(model, path)` of the newest checkpoint in `directory` that Keras
    loads (in safe mode), compiled, with its optimizer state; `(None,
    None)` when there is none.

    Newer checkpoints that do not load (truncated, corrupt, emptied by a
    full disk, refused by safe mode), whatever their names say, are skipped
    with one warning that names each and says why, and moved aside as
    `.unreadable-ckpt-<step>.keras`. If checkpoints exist but none loads,
    that is an error: starting over would silently throw their training
    away.
    """
    checkpoints = list_checkpoints(directory)
    restored, unreadable = None, {}
    for path in reversed(checkpoints):
        try:
            restored, restored_from = keras.saving.load_model(path), path
            break
        except Exception as error:  # noqa: BLE001 - any unreadable file
            unreadable[path] = describe_error(error)
    reasons = "; ".join(f"{path} ({why})" for path, why in unreadable.items())
    if restored is None:
        if checkpoints:
            raise ValueError(
                f"None of the {len(checkpoints)} checkpoints in {directory} "
                f"can be read, so training cannot resume: {reasons}. Expected "
                "at least one intact ckpt-<step>.keras; move the directory "
                "away to start over."
            )
        return None, None
    for path in unreadable:
        # Out of the way of later writes and of averaging, kept to inspect
        # (in a shared directory, by whichever process of the run is first).
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, os.path.join(directory, UNREADABLE_PREFIX + os.path.basename(path)))
    if unreadable:
        warnings.warn(
            f"Skipped {len(unreadable)} checkpoint(s) that cannot be read: "
            f"{reasons}. Moved aside with the prefix {UNREADABLE_PREFIX}; "
            f"resuming from {restored_from}.",
            stacklevel=stacklevel,
        )
    return restored, restored_from


def trained_steps(model):
    """The optimizer steps a restored checkpoint holds (its own count, not
    its file name's)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError(f"{model.name} has no optimizer state: not a training checkpoint.")
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def restore_latest(model, directory):
    """The newest readable checkpoint in `directory` as a compiled model, or
    None when there is none (`newest_readable`: unreadable ones are skipped
    with a warning and moved aside).

    The checkpoint must hold the same architecture as `model`: resuming a
    different model from it would silently train the wrong thing.
    """
    restored, _ = newest_readable(directory, stacklevel=3)
    if restored is None:
        return None
    expected = _architecture(model)
    found = _architecture(restored)
    if expected != found:
        differences = {
            key: (found.get(key), expected.get(key))
            for key in sorted(set(expected) | set(found))
            if expected.get(key) != found.get(key)
        }
        raise ValueError(
            f"{directory} holds checkpoints of a different model, so "
            "training cannot resume from it; use another model directory. "
            "Differences (checkpoint, requested): "
            + ", ".join(f"{k}={a!r} vs {b!r}" for k, (a, b) in differences.items())
        )
    return restored


def _architecture(model):
    config = dict(model.get_config())
    # The dropout seed is drawn afresh by each new model; the checkpoint's
    # own seed (and the streams' positions) continue.
    for key in ("name", "trainable", "dtype", "seed"):
        config.pop(key, None)
    return config


def _load_weights_of(path):
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as error:  # noqa: BLE001 - any unreadable file
        raise ValueError(f"Cannot read the checkpoint {path}: {str(error).splitlines()[0][:200]}") from None


def average_checkpoints(paths):
    """The element-wise mean of the weights of several checkpoints.

    Section 6.1: "For the base models, we used a single model obtained by
    averaging the last 5 checkpoints ... For the big models, we averaged the
    last 20 checkpoints."

    Args:
        paths: `.keras` checkpoints of one architecture.

    Returns:
        The model of the last checkpoint, holding the averaged weights,
        uncompiled: a model to translate with carries no optimizer state,
        which is twice the size of the weights under Adam.
    """
    if not paths:
        raise ValueError("Averaging needs at least one checkpoint. Received: []")
    models = [_load_weights_of(path) for path in paths]
    weights = [model.get_weights() for model in models]
    shapes = [[w.shape for w in ws] for ws in weights]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(
            "Checkpoints to average must hold the same architecture. "
            f"Received: {list(paths)}"
        )
    # Float weights are averaged; integer state (dropout seed generators)
    # comes from the last checkpoint.
    averaged = [
        np.mean(np.stack(tensors), axis=0).astype(tensors[-1].dtype)
        if np.issubdtype(tensors[-1].dtype, np.floating)
        else tensors[-1]
        for tensors in zip(*weights)
    ]
    model = models[-1]
    model.set_weights(averaged)
    return model
