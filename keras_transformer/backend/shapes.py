"""Reshapes and cache writes under torch, without Keras's per-operation checks.

`keras.ops.reshape(x, shape)` first asks whether any argument is a
symbolic Keras tensor, flattening `shape` as a tree to do so. Under
TensorFlow and JAX that is a C++ call; under torch it goes through Keras's
Python tree functions, which made it a fifth of a base-size training step
on an H100 (our attention layers reshape every projection's input and
output). `reshape` is `torch.reshape` for an eager torch tensor, and
`shape` its sizes.

`slice_update` writes a decoding step's keys and values into the cache.
Keras's torch `slice_update` at a tensor position builds a grid of indices
over the whole update and scatters it; while decoding under torch this
copies the cache and writes the update into a narrowed view of the copy,
the same result.
"""

import keras
from keras import ops

from keras_transformer.backend import state


def shape(x):
    """`keras.ops.shape(x)`: for an eager torch tensor, its sizes as ints,
    without Keras's check for symbolic tensors."""
    if keras.backend.backend() == "torch":
        import torch

        if type(x) is torch.Tensor:
            return tuple(x.shape)
    return ops.shape(x)


def reshape(x, shape):
    """x reshaped to `shape` (a tuple of ints, at most one -1)."""
    if keras.backend.backend() == "torch":
        import torch

        if isinstance(x, keras.Variable):
            x = x.value
        if isinstance(x, torch.Tensor):
            return torch.reshape(x, shape)
    return ops.reshape(x, shape)


def slice_update(inputs, start_indices, updates):
    """`keras.ops.slice_update(inputs, start_indices, updates)`."""
    if state.decoding() and keras.backend.backend() == "torch":
        import torch

        if (
            type(inputs) is torch.Tensor
            and type(updates) is torch.Tensor
            and len(start_indices) == inputs.ndim == updates.ndim
            and all(_is_start(start) for start in start_indices)
        ):
            outputs = inputs.clone()
            block = outputs
            for dim, (start, length) in enumerate(zip(start_indices, updates.shape)):
                block = block.narrow(dim, start, length)
            block.copy_(updates)
            return outputs
    return ops.slice_update(inputs, start_indices, updates)


def _is_start(start):
    import torch

    if isinstance(start, int):
        return True
    return isinstance(start, torch.Tensor) and start.ndim == 0 and not start.is_floating_point()
