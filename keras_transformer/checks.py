"""Checks on what a user gives the model: token ids and their types and
shapes, and how errors about files are worded. This module knows the
backend, so the layers need not.

An id outside the vocabulary is not an error on every backend: a gather on a
GPU or under JAX returns zeros or clamps silently, and torch fails with
"index out of range in self" without naming the input. The check below fails
loudly on every backend, saying which input, where, and what was expected.
"""

import contextlib
import functools
import math
import numbers
import sys
import threading
import types

import keras
import numpy as np

from keras_transformer.backend import keras_private


def check_count(name, value, least=1):
    """`value` must be a whole number (an int, or a float with no fraction)
    of at least `least`: NaN, infinities, fractions and bools are refused.

    Returns:
        `value` as an int.
    """
    whole = isinstance(value, numbers.Integral) or (
        isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer()
    )
    if isinstance(value, bool) or not whole or value < least:
        raise ValueError(f"`{name}` must be a whole number >= {least}. Received: {name}={value!r}")
    return int(value)


def describe_error(error):
    """`Type: first line of the message`, for errors that name a bad file."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else 'no message'}"


def _raise_if_out_of_range(ids, vocabulary_size, input_name):
    ids = np.asarray(ids)
    out_of_range = (ids < 0) | (ids >= vocabulary_size)
    if out_of_range.any():
        where = tuple(int(i) for i in np.argwhere(out_of_range)[0])
        raise ValueError(
            f"`{input_name}` holds {int(out_of_range.sum())} token id(s) "
            f"outside the vocabulary: {input_name}{list(where)} = "
            f"{ids[where]}, expected 0 <= id < vocabulary_size="
            f"{vocabulary_size}. The tokenizer and the model's "
            "`vocabulary_size` probably do not match."
        )


def assert_token_ids_in_range(ids, vocabulary_size, input_name="token_ids"):
    """Raises a clear error if an id is outside [0, vocabulary_size).

    Works eagerly and inside compiled functions: a graph assertion under
    TensorFlow, a host callback under `jax.jit`, a plain check under torch.
    TensorFlow's XLA compiler (`jit_compile=True`) drops graph assertions, so
    the check does not run there, nor inside `torch.compile`. Under JAX, `fit`, `evaluate` and `predict`
    check their data on the host instead where they can (see
    `check_ids_on_host`); an error raised inside a compiled step leaves that
    model's variables unusable in the process (Keras does not restore them),
    so reload it from a checkpoint.

    Returns:
        `ids`, unchanged, carrying a dependency on the check in TF graphs.
    """
    check = functools.partial(
        _raise_if_out_of_range,
        vocabulary_size=vocabulary_size,
        input_name=input_name,
    )
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.executing_eagerly():
            check(ids.numpy())
            return ids
        message = (
            f"`{input_name}` holds token ids outside the vocabulary: expected "
            f"0 <= id < vocabulary_size={vocabulary_size}. The tokenizer and "
            "the model's `vocabulary_size` probably do not match. Received:"
        )
        assertions = [
            tf.debugging.assert_non_negative(ids, message=message),
            tf.debugging.assert_less(
                ids, tf.cast(vocabulary_size, ids.dtype), message=message
            ),
        ]
        with tf.control_dependencies(assertions):
            return tf.identity(ids)
    if backend == "jax":
        import jax

        if isinstance(ids, jax.core.Tracer):
            if not getattr(_steps, "ids_checked_on_host", False):
                # Per shard: no gather of data-parallel ids onto one device.
                jax.debug.callback(check, ids, partitioned=True)
        else:
            check(ids)
        return ids
    if backend == "torch":
        import torch

        # Inside `torch.compile` a read back to the host breaks the graph
        # (one more frame to compile per call): the check does not run
        # there, as under TensorFlow's XLA.
        if not torch.compiler.is_compiling():
            check(ids.detach().cpu().numpy())
        return ids
    check(keras.ops.convert_to_numpy(ids))
    return ids


def _raise_if_past(positions, max_length):
    positions = np.asarray(positions)
    if positions.size and positions.max() >= max_length:
        raise ValueError(
            f"The learned position embeddings cover {max_length} positions "
            f"(max_length={max_length}). Received position {int(positions.max())}: "
            "a sequence of at most max_length tokens is expected."
        )


def assert_positions_below(positions, max_length):
    """Raises a clear error if a position is >= `max_length`.

    For learned position embeddings, whose gather would otherwise fail
    without naming the cause (TensorFlow, torch) or clamp silently to the
    last row (JAX, GPUs). Eagerly, the positions are checked at once; in a
    TensorFlow graph, by a graph assertion. Under `jax.jit` a traced start
    position is not checked here: the decoding buffers, which bound it, are
    checked against `max_length` when they are made
    (`Transformer.initial_cache`).

    Returns:
        `positions`, unchanged, carrying the check in TF graphs.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.executing_eagerly():
            _raise_if_past(positions.numpy(), max_length)
            return positions
        check = tf.debugging.assert_less(
            positions,
            tf.cast(max_length, positions.dtype),
            message=f"The learned position embeddings cover {max_length} positions "
            f"(max_length={max_length}); a sequence of at most max_length tokens "
            "is expected. Received positions:",
        )
        with tf.control_dependencies([check]):
            return tf.identity(positions)
    if backend == "jax":
        import jax

        if not isinstance(positions, jax.core.Tracer):
            _raise_if_past(positions, max_length)
        return positions
    _raise_if_past(keras.ops.convert_to_numpy(positions), max_length)
    return positions


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenIdCheck(keras.layers.Layer):
    """Passes ids through, failing clearly on ids outside the vocabulary.

    Args:
        vocabulary_size: ids must lie in [0, vocabulary_size).
        input_name: the name the error message gives the input.
    """

    def __init__(self, vocabulary_size, input_name="token_ids", **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.input_name = input_name
        self.built = True

    def __call__(self, ids, *args, decoding=None, **kwargs):
        # In torch's decoding calls, as our layers do (layers/calls.py):
        # `Layer.__call__` costs more than the check. Arrays go through it,
        # which makes them tensors.
        if decoding is not None and decoding.direct and keras.ops.is_tensor(ids):
            return self.call(ids)
        return super().__call__(ids, *args, **kwargs)

    def call(self, ids):
        return assert_token_ids_in_range(
            ids, self.vocabulary_size, self.input_name
        )

    def compute_output_spec(self, ids):
        return keras.KerasTensor(ids.shape, dtype=ids.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "input_name": self.input_name,
            }
        )
        return config


# Keras converts a model's inputs to the int32 of its `keras.Input`s before
# any layer runs: 5.7 becomes 5, and under JAX (64-bit types off) 2**32 + 5
# becomes 5. So the model's inputs are checked as they arrive, before that.
INPUT_NAMES = ("source_ids", "target_ids")
_WIDER_THAN_INT32 = ("int64", "uint32", "uint64")


def check_model_inputs(inputs, vocabulary_size):
    """Rejects model inputs that Keras would otherwise turn into other ids.

    `inputs` is `{"source_ids": [B, S], "target_ids": [B, T]}`, as arrays,
    tensors of any backend, or symbolic tensors. Ids must be integers, the
    two inputs must be `[batch, length]` with one batch size, and both
    lengths at least 1 (a sequence of no tokens has nothing to attend to).
    Ids of types wider than int32 are checked against the vocabulary here,
    before the cast to int32 could wrap them into it. Static properties are
    checked at once; under TensorFlow, dynamic shapes are checked in the
    graph. Other inputs (a model called on something else) pass unchanged.

    Returns:
        `inputs`, with the ids carrying the graph checks under TensorFlow.
    """
    if not isinstance(inputs, dict) or set(inputs) != set(INPUT_NAMES):
        return inputs
    # Placeholders stand for the data's shapes, not its types or values.
    placeholders = _inferring_shapes([inputs[name] for name in INPUT_NAMES])
    checked = {}
    for name in INPUT_NAMES:
        ids = inputs[name]
        if isinstance(ids, (list, tuple)):
            ids = np.asarray(ids)
        if not hasattr(ids, "dtype") or not hasattr(ids, "shape"):
            # Per-replica values under tf.distribute: each replica's call
            # checks its own.
            return inputs
        dtype = keras.backend.standardize_dtype(ids.dtype)
        if "int" not in dtype and not placeholders:
            raise TypeError(
                f"`{name}` must hold integer token ids. Received dtype "
                f"{dtype}, which would be cut to integers (5.7 read as 5)."
            )
        if len(ids.shape) != 2:
            raise ValueError(
                f"`{name}` must be [batch, length] token ids. Received shape "
                f"{tuple(ids.shape)}."
            )
        if ids.shape[1] == 0:
            raise ValueError(
                f"`{name}` must hold at least one token per row (source + EOS, "
                f"or BOS + target). Received shape {tuple(ids.shape)}."
            )
        if dtype in _WIDER_THAN_INT32 and not placeholders:
            if isinstance(ids, np.ndarray):
                _raise_if_out_of_range(ids, vocabulary_size, name)
            elif not isinstance(ids, keras.KerasTensor):
                ids = assert_token_ids_in_range(ids, vocabulary_size, name)
        checked[name] = ids
    source, target = (checked[name] for name in INPUT_NAMES)
    if None not in (source.shape[0], target.shape[0]) and source.shape[0] != target.shape[0]:
        raise ValueError(
            "`source_ids` and `target_ids` must hold the same number of rows "
            f"(one source per target). Received shapes {tuple(source.shape)} "
            f"and {tuple(target.shape)}."
        )
    if keras.backend.backend() == "tensorflow":
        checked = _check_dynamic_shapes(checked)
    return {**inputs, **checked}


def _check_dynamic_shapes(inputs):
    """Batch sizes and lengths that a TensorFlow graph knows only when run."""
    import tensorflow as tf

    source, target = (inputs[name] for name in INPUT_NAMES)
    if tf.executing_eagerly() or isinstance(source, (np.ndarray, keras.KerasTensor)):
        return inputs
    if not (tf.is_tensor(source) and tf.is_tensor(target)):
        return inputs
    source_shape, target_shape = tf.shape(source), tf.shape(target)
    assertions = [
        tf.debugging.assert_equal(
            source_shape[0],
            target_shape[0],
            message="`source_ids` and `target_ids` must hold the same number "
            "of rows (one source per target). Received batch sizes:",
        ),
        tf.debugging.assert_positive(
            source_shape[1],
            message="`source_ids` must hold at least one token per row. Received length:",
        ),
        tf.debugging.assert_positive(
            target_shape[1],
            message="`target_ids` must hold at least one token per row. Received length:",
        ),
    ]
    with tf.control_dependencies(assertions):
        return {name: tf.identity(inputs[name]) for name in INPUT_NAMES}


def _inferring_shapes(inputs=()):
    """Whether Keras runs the model on placeholders to learn its output
    shapes (`compute_output_spec`). They have the data's shapes but not
    always its type: under tf.distribute, Keras builds from the replicas'
    mean, a float batch."""
    return keras_private.in_symbolic_scope(inputs)


def check_model_data(x, vocabulary_size):
    """`check_model_inputs` for what `fit`, `evaluate` and `predict` take,
    before their data adapters convert it (under JAX, to int32).

    Arrays are checked at once. A `tf.data.Dataset` of ids is checked as it
    runs: its element types at once, and ids of 64-bit types against the
    vocabulary in the pipeline. Other sources (generators, `PyDataset`) are
    checked where the model is called.
    """
    if isinstance(x, dict):
        return check_model_inputs(x, vocabulary_size)
    if not (_is_tf_dataset(x) and _holds_model_inputs(x)):
        return x
    spec = x.element_spec
    features = spec[0] if isinstance(spec, tuple) else spec
    for name in INPUT_NAMES:
        if not features[name].dtype.is_integer:
            raise TypeError(
                f"`{name}` must hold integer token ids. Received a dataset of "
                f"dtype {features[name].dtype.name}, which would be cut to "
                "integers (5.7 read as 5)."
            )
    if all(features[name].dtype.name not in _WIDER_THAN_INT32 for name in INPUT_NAMES):
        return x

    return x.map(_in_range_in_pipeline(vocabulary_size))


# === Under JAX: ids checked on the host, before the compiled steps ===
# Inside `jax.jit` the check above is a host callback, a round trip from the
# device to Python in every step, which on a GPU cut training speed to a
# third. So under JAX, `fit`, `evaluate` and `predict` check
# the ids on the host as the data arrives, and trace their steps without the
# callback. Data that cannot be checked there (a `PyDataset`, for one) keeps
# the callback.

_steps = threading.local()


@contextlib.contextmanager
def ids_checked_on_host(checked):
    """Within: traced steps leave out the id callback if `checked`."""
    previous = getattr(_steps, "ids_checked_on_host", False)
    _steps.ids_checked_on_host = checked
    try:
        yield
    finally:
        _steps.ids_checked_on_host = previous


def check_ids_on_host(x, vocabulary_size):
    """Checks the ids of `fit`/`evaluate`/`predict` data on the host.

    Under JAX only (elsewhere the checks in the steps are cheap, or eager).
    Arrays are checked at once; a `tf.data.Dataset` in its pipeline and a
    generator as it yields, each batch before it reaches a step.

    Returns:
        `(x, checked)`: the data, wrapped where it is checked as it runs, and
        whether every batch of it is checked before a step.
    """
    if keras.backend.backend() != "jax":
        return x, False
    if isinstance(x, dict):
        if set(x) != set(INPUT_NAMES):
            return x, False
        for name in INPUT_NAMES:
            if isinstance(x[name], keras.KerasTensor) or not hasattr(x[name], "dtype"):
                return x, False
            _raise_if_out_of_range(np.asarray(x[name]), vocabulary_size, name)
        return x, True
    if isinstance(x, types.GeneratorType):

        def checked_batches():
            for batch in x:
                features = batch[0] if isinstance(batch, tuple) else batch
                if isinstance(features, dict) and set(features) == set(INPUT_NAMES):
                    for name in INPUT_NAMES:
                        ids = np.asarray(features[name])
                        if "int" in ids.dtype.name:  # others fail in the step
                            _raise_if_out_of_range(ids, vocabulary_size, name)
                yield batch

        return checked_batches(), True
    from keras_transformer.data.batches import TokenBatches  # data imports checks

    if isinstance(x, TokenBatches):
        if x.vocabulary_size > vocabulary_size:
            raise ValueError(
                f"The batches hold ids of a vocabulary of {x.vocabulary_size} pieces, but the "
                f"model's vocabulary_size is {vocabulary_size}. The tokenizer and the model "
                "probably do not match."
            )
        return x, True  # their ids are below their vocabulary's size
    if _is_tf_dataset(x) and _holds_model_inputs(x):
        return x.map(_in_range_in_pipeline(vocabulary_size)), True
    return x, False


def _is_tf_dataset(x):
    """Whether `x` is a `tf.data.Dataset`; no TensorFlow, no such dataset."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


def _holds_model_inputs(dataset):
    spec = dataset.element_spec
    features = spec[0] if isinstance(spec, tuple) else spec
    return isinstance(features, dict) and set(features) == set(INPUT_NAMES)


def _in_range_in_pipeline(vocabulary_size):
    """A `tf.data` map that fails on ids outside [0, vocabulary_size)."""
    import tensorflow as tf

    message = (
        "holds token ids outside the vocabulary: expected 0 <= id < "
        f"vocabulary_size={vocabulary_size}. Received:"
    )

    def in_range(*element):
        ids = element[0]
        wide = {name: tf.cast(ids[name], tf.int64) for name in INPUT_NAMES}
        assertions = [
            check(wide[name], message=f"`{name}` {message}")
            for name in INPUT_NAMES
            for check in (
                tf.debugging.assert_non_negative,
                functools.partial(tf.debugging.assert_less, y=tf.constant(vocabulary_size, tf.int64)),
            )
        ]
        with tf.control_dependencies(assertions):
            checked = tf.nest.map_structure(tf.identity, element)
        return checked if len(element) > 1 else checked[0]

    return in_range
