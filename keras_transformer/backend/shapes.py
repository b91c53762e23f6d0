"""Reshapes and cache writes under torch, without Keras's per-operation checks.

`keras.ops.reshape(x, shape)` first asks whether any argument is a
symbolic Keras tensor, flattening `shape` as a tree to do so. Under
TensorFlow and JAX that is a C++ call; under torch it goes through Keras's
Python tree functions, which made it a fifth of a base-size training step
on an H100 (our attention layers reshape every projection's input and
output). `reshape` is `torch.reshape` for an eager torch tensor, and
`shape` its sizes.

`slice_update` writes a decoding step's keys and values into the cache,
and `slice` reads a step's ids and position encodings. Keras's torch
`slice_update` at a tensor position builds a grid of indices over the whole
update and scatters it, and its `slice` reads each start back to the host
to narrow the input: on a GPU every such read waits for all the work queued
before it, a dozen times a decoding step, so that the host cannot run ahead
of the GPU. While decoding under torch, `slice_update` copies the cache and
writes the update into a block of the copy (in a search's step, which holds
its caches alone, into the cache itself), and both take a tensor start
where it is, on the device, as an index (`index_copy_`, `index_select`);
the same results.

`take_rows` and `take_along_axis` gather with indices known to be in
range (token ids, chosen beams). Keras's torch versions first cast the
indices to int64 and map negative ones: three or four more operations a
gather, that is a kernel each on a GPU, where a decoding step is bound by
the host's launches. In torch's direct calls, they are torch's own gather.
"""

import keras
from keras import ops

from keras_transformer.backend.options import memoized


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


def slice_update(inputs, start_indices, updates, decoding=None):
    """`keras.ops.slice_update(inputs, start_indices, updates)`; under
    `decoding` (a `DecodingOptions`) in a search's step, in place."""
    if decoding is not None and keras.backend.backend() == "torch":
        import torch

        if (
            type(inputs) is torch.Tensor
            and type(updates) is torch.Tensor
            and len(start_indices) == inputs.ndim == updates.ndim
            and all(_is_integer(start) for start in start_indices)
        ):
            # A search's own cache is written in place (a copy of every
            # layer's cache a step, otherwise).
            in_place = decoding.step is not None and inputs.is_contiguous()  # not a broadcast view
            outputs = inputs if in_place else inputs.clone()
            block, positions = outputs, None
            for dim, (start, length) in enumerate(zip(start_indices, updates.shape)):
                if positions is None and not isinstance(start, int):
                    positions = dim, _positions(start, length, inputs.device, decoding)
                else:
                    block = block.narrow(dim, start, length)
            if positions is None:
                block.copy_(updates)
            else:
                block.index_copy_(*positions, updates)
            return outputs
    return ops.slice_update(inputs, start_indices, updates)


def slice(inputs, start_indices, shape, decoding=None):  # noqa: A001 - keras.ops.slice's name
    """`keras.ops.slice(inputs, start_indices, shape)`."""
    if decoding is not None and keras.backend.backend() == "torch":
        import torch

        if (
            type(inputs) is torch.Tensor
            and len(start_indices) == len(shape) == inputs.ndim
            and all(_is_integer(start) for start in start_indices)
            and all(_is_integer(length) for length in shape)
        ):
            outputs = inputs
            # A length is a size (an int, or a tracer's record of one).
            for dim, (start, length) in enumerate(zip(start_indices, map(int, shape))):
                if isinstance(start, int):
                    outputs = outputs.narrow(dim, start, length)
                else:
                    outputs = outputs.index_select(dim, _positions(start, length, inputs.device, decoding))
            return outputs
    return ops.slice(inputs, start_indices, shape)


def take_rows(x, rows, decoding=None):
    """`keras.ops.take(x, rows, axis=0)` for int `rows`, none negative."""
    if decoding is not None and decoding.direct and keras.backend.backend() == "torch":
        import torch

        if isinstance(x, keras.Variable):
            x = x.value
        if isinstance(x, torch.Tensor) and type(rows) is torch.Tensor:
            if x.ndim == 2:
                return torch.nn.functional.embedding(rows, x)  # Keras's op for a table
            if rows.ndim == 1:
                return torch.index_select(x, 0, rows)
    return ops.take(x, rows, axis=0)


def take_along_axis(x, indices, axis, decoding=None):
    """`keras.ops.take_along_axis(x, indices, axis)` for int `indices`, none
    negative."""
    if decoding is not None and decoding.direct and keras.backend.backend() == "torch":
        import torch

        if type(x) is torch.Tensor and type(indices) is torch.Tensor:
            return torch.take_along_dim(x, indices.long(), dim=axis)
    return ops.take_along_axis(x, indices, axis=axis)


def _positions(start, length, device, decoding):
    """`start .. start + length - 1` for a tensor `start`, on `device`,
    without reading `start` back to the host."""
    import torch

    length = int(length)  # a size; a 0-d tensor while a loop is traced

    def positions():
        return start.to(device=device, dtype=torch.int64).reshape(1) + torch.arange(length, device=device)

    # The blocks of a decoding step write their caches at the same positions.
    return memoized(decoding, ("positions", length, device), (start,), positions)


def _is_integer(value):
    """Whether `value` is an int or a 0-d integer tensor: a start or a length."""
    import torch

    if isinstance(value, int):
        return True
    return isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point()
