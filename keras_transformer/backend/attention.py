"""Scaled dot-product attention on the layouts our attention layer keeps.

`dot_product_attention` takes queries, keys and values with the heads
third, `[B, T, N, H]`, as `keras.ops.dot_product_attention` does. Under
JAX on a GPU, half-precision attention goes to cuDNN's fused kernel with
the mask spelled out to `[B, 1, T, S]`, the form it takes (a padding mask
`[B, 1, 1, S]` it refuses); what cuDNN cannot take (float32, odd lengths
in training, head sizes off its grid) goes to XLA's attention without
Keras's attempt and logged traceback. While decoding under torch, torch's
`scaled_dot_product_attention` gets the heads-second views of the inputs
as they are, where Keras's copies each into a contiguous tensor first.

`attend_to_cache` is attention over a heads-major `[B, N, S, H]` cache,
which torch's fused attention takes as it is; elsewhere the attention layer
writes the softmax out.
"""

import keras
from keras import ops

from keras_transformer.backend import state

_large_negatives = {}


def flash_attention():
    """`keras.ops.dot_product_attention`'s `flash_attention` argument."""
    return False if keras.backend.backend() == "jax" else None


def dot_product_attention(query, key, value, mask, scale):
    """Attention of `[B, T, N, H]` queries over `[B, S, N, H]` keys and
    values, with a boolean mask `[B or 1, T, S]` (True: attend) or None."""
    if state.decoding() and keras.backend.backend() == "torch" and _fits_torch(query, key, value, mask):
        attended = _torch_attention(
            query.transpose(1, 2),  # [B, N, T, H] views of [B, T, N, H]
            key.transpose(1, 2),
            value.transpose(1, 2),
            None if mask is None else mask[:, None],
            scale,
        )
        return attended.transpose(1, 2)
    if keras.backend.backend() == "jax" and jax_implementation(query, key) == "cudnn":
        return _cudnn_attention(query, key, value, mask, scale)
    return ops.dot_product_attention(
        query,
        key,
        value,
        mask=None if mask is None else mask[:, None],  # [B, 1, T, S]
        scale=scale,
        flash_attention=flash_attention(),
    )


def jax_implementation(query, key, platform=None):
    """`jax.nn.dot_product_attention`'s implementation for `[B, T, N, H]`
    queries and `[B, S, N, H]` keys: "cudnn" where cuDNN's fused attention
    takes them (a GPU, float16 or bfloat16, head size a multiple of 8 up
    to 128, even lengths), else "xla". `platform` defaults to JAX's."""
    import jax

    platform = platform or jax.default_backend()
    _, length, _, head_size = query.shape
    key_length = key.shape[1]
    takes = (
        platform == "gpu"
        and keras.backend.standardize_dtype(query.dtype) in ("float16", "bfloat16")
        and query.dtype == key.dtype
        and head_size % 8 == 0
        and head_size <= 128
        and length % 2 == 0
        and key_length % 2 == 0
    )
    return "cudnn" if takes else "xla"


def cudnn_mask(mask, query_length, key_length):
    """A boolean `[B or 1, T or 1, S]` mask as the `[B, 1, T, S]` cuDNN
    takes: every query's row written out, one head broadcast."""
    import jax.numpy as jnp

    if mask is None:
        return None
    return jnp.broadcast_to(mask, (mask.shape[0], query_length, key_length))[:, None]


def _cudnn_attention(query, key, value, mask, scale):
    import jax

    return jax.nn.dot_product_attention(
        query,
        key,
        value,
        mask=cudnn_mask(mask, query.shape[1], key.shape[1]),
        scale=scale,
        implementation="cudnn",
    )


def attend_to_cache(query, key, value, mask, scale):
    """Attention of `[B, T, N, H]` queries over a `[B, N, S, H]` cache in
    torch's fused attention, while decoding float32 under torch; None
    elsewhere, where the caller writes the softmax out."""
    if not (state.decoding() and keras.backend.backend() == "torch"):
        return None
    import torch

    if not (
        _fits_torch(query, key, value, mask, heads_axis=1)
        and query.dtype == torch.float32
    ):
        return None
    attended = _torch_attention(
        query.transpose(1, 2),  # [B, N, T, H]
        key,
        value,
        None if mask is None else mask[:, None],  # [B or 1, 1, T, S]
        scale,
    )
    return attended.transpose(1, 2)  # [B, T, N, H]


def _fits_torch(query, key, value, mask, heads_axis=2):
    import torch

    return (
        all(type(tensor) is torch.Tensor and tensor.ndim == 4 for tensor in (query, key, value))
        and query.shape[2] == key.shape[heads_axis] == value.shape[heads_axis]  # no grouped heads
        and query.dtype == key.dtype == value.dtype
        and (mask is None or (type(mask) is torch.Tensor and mask.dtype == torch.bool))
    )


def _torch_attention(query, key, value, mask, scale):
    """torch's fused attention of `[B, N, T, H]` queries and `[B, N, S, H]`
    keys and values, the boolean mask made additive with Keras's stand-in
    for -inf (-0.7 times the dtype's largest finite value)."""
    import torch

    if mask is not None:
        negative_key = (query.dtype, query.device)
        if negative_key not in _large_negatives:
            largest = 65500.0 if query.dtype == torch.float16 else 3.38953e38
            _large_negatives[negative_key] = torch.tensor(largest * -0.7, dtype=query.dtype, device=query.device)
        mask = torch.where(mask, 0.0, _large_negatives[negative_key])
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
