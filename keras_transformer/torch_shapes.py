"""Reshapes in our layers' calls under torch, without Keras's symbolic check.

`keras.ops.reshape(x, shape)` first asks whether any of its arguments is a
symbolic Keras tensor, and to ask it flattens the `shape` tuple as a tree.
Under TensorFlow and JAX that is a C++ call; under torch it goes through
Keras's Python tree functions on torch's pytree, about 70 microseconds a
reshape on this project's CPUs. The attention layers reshape each
projection's input and output (section 3.2's heads, stacked per token): on
an H100, where Keras's torch backend runs one operation at a time from the
host, that check took 60 ms of a 330 ms training step of the base model
(cProfile, benchmarks/README.md).

This is the one module that knows it: `reshape(x, shape)` is
`torch.reshape` for an eager torch tensor, which is what Keras's torch
reshape runs after its check (a variable's tensor included), and
`keras.ops.reshape` for anything else (symbolic tensors, other backends).
"""

import keras

if keras.backend.backend() == "torch":
    import torch

    def reshape(x, shape):
        """x reshaped to `shape` (a tuple of ints, at most one -1)."""
        if isinstance(x, keras.Variable):
            x = x.value
        if isinstance(x, torch.Tensor):
            return torch.reshape(x, shape)
        return keras.ops.reshape(x, shape)

else:
    reshape = keras.ops.reshape
