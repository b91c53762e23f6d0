"""Checks on token ids. This module knows the backend, so the layers need not.

An id outside the vocabulary is not an error on every backend: a gather on a
GPU or under JAX returns zeros or clamps silently, and torch fails with
"index out of range in self" without naming the input. The check below fails
loudly on every backend, saying which input, where, and what was expected.
"""

import functools

import keras
import numpy as np


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
    the check does not run there. Under JAX, an error raised inside Keras's
    compiled `fit`/`predict` loop leaves that model's variables unusable in
    the process (Keras does not restore them); reload it from a checkpoint.

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
            # Per shard: no gather of data-parallel ids onto one device.
            jax.debug.callback(check, ids, partitioned=True)
        else:
            check(ids)
        return ids
    if backend == "torch":
        check(ids.detach().cpu().numpy())
        return ids
    check(keras.ops.convert_to_numpy(ids))
    return ids


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
