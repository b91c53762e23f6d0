"""Weights made with given values: a converted model, built once.

Built from its initializers, a model writes every number of every weight
(random draws and their temporaries) before a converter overwrites them
all: a second model's worth of memory, as its weights are replaced. Inside
`initial_values(values)`, each weight of our layers is made from its value
in `values` (by variable path), read as the weight is made, so the model
holds one copy of its weights and the converter at most the one being made
besides (`convert/pipeline.py`).
"""

import contextlib
import contextvars

import keras
import numpy as np

_GIVEN = contextvars.ContextVar("keras_transformer_initial_values", default=None)


class Given:
    """The values of `initial_values`: what is left of them, the paths of
    the weights made from them, and the error of the first value that
    could not be used (raised by the caller after the build: Keras
    reports an error inside a layer's build as the layer's)."""

    def __init__(self, values):
        self.values = values
        self.paths = set()
        self.error = None

    def initializer(self, path, default):
        """An initializer of the weight `path` that gives its value, or
        `default` where none is given."""
        if path not in self.values:
            return default
        value = self.values.pop(path)
        self.paths.add(path)

        def initialize(shape, dtype=None):
            nonlocal value
            try:
                found = np.asarray(value() if callable(value) else value)
            except ValueError as error:  # a converter's error reading the value
                return self._failed(error, shape, dtype)
            value = None  # held no longer than the weight's making
            if tuple(found.shape) != tuple(shape):
                error = ValueError(f"the tensor for {path} has shape {tuple(found.shape)}; expected {tuple(shape)}.")
                return self._failed(error, shape, dtype)
            return found.astype(keras.backend.standardize_dtype(dtype or keras.config.floatx()), copy=False)

        return initialize

    def _failed(self, error, shape, dtype):
        self.error = self.error or error
        return keras.ops.zeros(shape, dtype=dtype)


@contextlib.contextmanager
def initial_values(values):
    """Inside, the weights our layers make take their first values from
    `values`, a dict of NumPy arrays, or functions of no arguments that
    give them, by variable path; each leaves `values` as it is used.
    Yields the `Given`."""
    given = Given(values)
    token = _GIVEN.set(given)
    try:
        yield given
    finally:
        _GIVEN.reset(token)


def initializer(layer, name, default):
    """The initializer of `layer`'s weight `name`: its given value inside
    `initial_values`, else `default`."""
    given = _GIVEN.get()
    return default if given is None or name is None else given.initializer(f"{layer.path}/{name}", default)
