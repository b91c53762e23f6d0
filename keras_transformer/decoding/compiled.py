"""Decoding functions compiled once per input shape, on each backend.

This is the one module of `decoding/` that knows the backend. Under
TensorFlow a function becomes a `tf.function` whose input signature leaves
every dimension open, so it is traced once for all shapes. Under JAX it
becomes a `jax.jit` function of the model's weights and its inputs, so it is
compiled once per input shape and the weights are not baked in as
constants. Under torch it runs eagerly, without autograd.
"""

import keras
import numpy as np


class CompiledFunction:
    """`fn(*inputs)` of a model, compiled for the current backend.

    Args:
        fn: a function of int32 tensors that calls `model`'s layers and
            returns a nest of tensors.
        model: the model whose weights `fn` reads.
        input_ranks: the rank of each input, for TensorFlow's signature.
        jit_compile: compile with XLA under TensorFlow (JAX always does).

    Call it with NumPy arrays; it returns NumPy arrays. `traces` counts how
    often `fn` was traced: once per call under torch, which runs eagerly.
    """

    def __init__(self, fn, model, input_ranks, jit_compile=False):
        self.fn = fn
        self.model = model
        self.traces = 0
        backend = keras.backend.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            signature = [tf.TensorSpec([None] * rank, tf.int32) for rank in input_ranks]
            self._call = tf.function(
                self._traced, input_signature=signature, jit_compile=jit_compile
            )
        elif backend == "jax":
            import jax

            def stateless(values, *inputs):
                mapping = list(zip(model.variables, values))
                with keras.StatelessScope(state_mapping=mapping):
                    return self._traced(*inputs)

            jitted = jax.jit(stateless)
            self._call = lambda *inputs: jitted([v.value for v in model.variables], *inputs)
        elif backend == "torch":
            import torch

            def eager(*inputs):
                with torch.no_grad():
                    return self._traced(*inputs)

            self._call = eager
        else:
            raise ValueError(
                "Decoding runs under the tensorflow, jax and torch backends. "
                f"Received: KERAS_BACKEND={backend!r}"
            )

    def _traced(self, *inputs):
        self.traces += 1
        return self.fn(*inputs)

    def __call__(self, *inputs):
        inputs = [keras.ops.convert_to_tensor(np.asarray(x, "int32")) for x in inputs]
        outputs = self._call(*inputs)
        return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)
