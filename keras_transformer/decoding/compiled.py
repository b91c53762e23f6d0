"""Decoding functions compiled once per input shape, on each backend.

Under TensorFlow a function becomes a `tf.function` whose input signature
leaves every dimension open, so it is traced once for all shapes; with XLA,
which compiles each shape anyway, it is traced once per shape. Under JAX it
becomes a `jax.jit` function of the model's weights and its inputs, so it
is compiled once per input shape and the weights are not baked in as
constants. Under torch it runs eagerly, without autograd; our layers call
each other's `call` directly and the search's loops are recorded once per
shapes and replayed (`backend.loops`). How it computes on its backend is
one `backend.options.DecodingOptions`, which the function is given as its
`decoding` argument and passes on.
"""

import keras
import numpy as np

from keras_transformer.backend import loops as backend_loops
from keras_transformer.backend.options import DecodingOptions
from keras_transformer.layers.utils import sublayers


class CompiledFunction:
    """`fn(*inputs)` of a model, compiled for the current backend.

    Args:
        fn: `fn(*inputs, decoding)`, a function of int32 tensors and a
            `DecodingOptions` that calls `model`'s layers and returns a
            nest of tensors.
        model: the model whose weights `fn` reads.
        input_ranks: the rank of each input, for TensorFlow's shape-generic
            signature (without XLA).
        jit_compile: compile with XLA under TensorFlow (JAX always does).
        direct_layer_calls: under torch, our built layers call each other's
            `call` without `Layer.__call__` when no layer of `model`
            autocasts.
        trace_loops: under torch, with direct layer calls, trace the
            condition and body of each loop in `fn` once per shapes and
            replay the traces (`backend.loops.TracedLoops`).
        traces: the most traces kept (`TracedLoops`'s `size`).

    Call it with NumPy arrays; it returns NumPy arrays. `traces` counts how
    often `fn` was traced: once per call under torch, which runs eagerly.
    `decoding` is the `DecodingOptions` given to `fn`; `loops`, its
    `TracedLoops` under torch where loops are recorded, else None.
    """

    def __init__(self, fn, model, input_ranks, jit_compile=False, direct_layer_calls=True, trace_loops=True,
                 traces=256):
        self.fn = fn
        self.model = model
        self.traces = 0
        backend = keras.backend.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            if jit_compile:
                # Traced once per shape, the function sees static shapes,
                # and the search's caches can grow in phases.
                self.decoding = DecodingOptions(xla=True)
                self._call = tf.function(self._traced, jit_compile=True, reduce_retracing=False)
            else:
                self.decoding = DecodingOptions(float_int8=True)
                signature = [tf.TensorSpec([None] * rank, tf.int32) for rank in input_ranks]
                self._call = tf.function(self._traced, input_signature=signature)
        elif backend == "jax":
            import jax

            self.decoding = DecodingOptions(xla=True)

            def stateless(values, *inputs):
                mapping = list(zip(model.variables, values))
                with keras.StatelessScope(state_mapping=mapping):
                    return self._traced(*inputs)

            jitted = jax.jit(stateless)
            self._call = lambda *inputs: jitted([v.value for v in model.variables], *inputs)
        elif backend == "torch":
            import torch

            direct = direct_layer_calls and _has_one_dtype(model)
            loops = backend_loops.TracedLoops(model, traces) if direct and trace_loops else None
            self.decoding = DecodingOptions(direct=direct, loops=loops)

            def eager(*inputs):
                with torch.no_grad():
                    return self._traced(*inputs)

            self._call = eager
        else:
            raise ValueError(
                "Decoding runs under the tensorflow, jax and torch backends. "
                f"Received: KERAS_BACKEND={backend!r}"
            )

    @property
    def loops(self):
        return self.decoding.loops

    def _traced(self, *inputs):
        self.traces += 1
        return self.fn(*inputs, decoding=self.decoding)

    def __call__(self, *inputs):
        inputs = [keras.ops.convert_to_tensor(np.asarray(x, "int32")) for x in inputs]
        outputs = self._call(*inputs)
        return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


def _has_one_dtype(model):
    """Whether no layer of `model` autocasts: mixed precision policies need
    `Layer.__call__`'s dtype scope."""
    return all(
        layer.compute_dtype == layer.variable_dtype
        for layer in sublayers(model)
    )
