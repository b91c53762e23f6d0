"""Scaled dot-product attention on the layouts our attention layer keeps.

`dot_product_attention` takes queries, keys and values with the heads
third, `[B, T, N, H]`, as `keras.ops.dot_product_attention` does. Under
JAX on a GPU, half-precision attention over 128 positions or more goes to
cuDNN's fused kernel with the mask spelled out to `[B, 1, T, S]`, the form
it takes (a padding mask `[B, 1, 1, S]` it refuses); shorter sentences,
where XLA's attention is faster, and what cuDNN cannot take (float32, odd
lengths, head sizes off its grid) go to XLA's attention without Keras's
attempt and logged traceback. While decoding under torch, torch's
`scaled_dot_product_attention` gets the heads-second views of the inputs
as they are, in training and decoding alike, where Keras's copies each into
a contiguous tensor first (in a torch step, three copies and a dozen more
operations for the host to launch).

`attend_to_cache` is attention over a heads-major `[B, N, S, H]` cache,
which torch's fused attention takes as it is; elsewhere the attention layer
writes the softmax out.
"""

import contextlib
import warnings

import keras
from keras import ops

from keras_transformer.backend.options import memoized

_large_negatives = {}
_refusals = []  # why cuDNN refused, once warned
_xla_only = []  # inside `xla_attention()`


@contextlib.contextmanager
def xla_attention():
    """Attention traced inside runs XLA's implementation under JAX, also
    where cuDNN's would: to measure one against the other."""
    _xla_only.append(True)
    try:
        yield
    finally:
        _xla_only.pop()


def flash_attention():
    """`keras.ops.dot_product_attention`'s `flash_attention` argument."""
    return False if keras.backend.backend() == "jax" else None


def dot_product_attention(query, key, value, mask, scale, decoding=None):
    """Attention of `[B, T, N, H]` queries over `[B, S, N, H]` keys and
    values, with a boolean mask `[B or 1, T, S]` (True: attend) or None;
    `decoding`, the `DecodingOptions` of a decoding call, or None."""
    if keras.backend.backend() == "torch" and _fits_torch(query, key, value, mask):
        attended = _torch_attention(
            query.transpose(1, 2),  # [B, N, T, H] views of [B, T, N, H]
            key.transpose(1, 2),
            value.transpose(1, 2),
            mask,
            scale,
            decoding,
        )
        return attended.transpose(1, 2)
    if keras.backend.backend() == "jax" and jax_implementation(query, key) == "cudnn":
        attended = _cudnn_attention(query, key, value, mask, scale)
        if attended is not None:
            return attended
    return ops.dot_product_attention(
        query,
        key,
        value,
        mask=None if mask is None else mask[:, None],  # [B, 1, T, S]
        scale=scale,
        flash_attention=flash_attention(),
    )


def zero_where_no_key(attended, mask, decoding=None):
    """`attended` `[B, T, N, H]`, zero for each query that `mask` `[B or 1,
    T, S]` lets attend to no key. Under torch with torch tensors, the same
    operations as torch's, without Keras's conversions around each."""
    if keras.backend.backend() == "torch":
        import torch

        if type(attended) is torch.Tensor and type(mask) is torch.Tensor:
            attends = memoized(
                decoding, ("attends", attended.dtype), (mask,), lambda: mask.any(-1)[:, :, None, None].to(attended.dtype)
            )
            return attended * attends
    attends = ops.any(mask, axis=-1)[:, :, None, None]  # [B, T, 1, 1]
    return attended * ops.cast(attends, attended.dtype)


# Below this many queries or keys, XLA's attention ran faster than cuDNN's
# fused kernel on an H200 (bfloat16, 8 heads of 64, forward and backward, at
# 25,000 positions a batch: XLA 2.3-3.4x faster at 16-32, 1.1-1.2x at 64;
# cuDNN 1.2x faster at 128 and 1.4-1.5x at 256; a timing of the two kernels
# alone, in git history, not among the benchmarks kept).
CUDNN_MIN_LENGTH = 128


def jax_implementation(query, key, platform=None):
    """`jax.nn.dot_product_attention`'s implementation for `[B, T, N, H]`
    queries and `[B, S, N, H]` keys: "cudnn" where cuDNN's fused attention
    takes them (`cudnn_takes`) and both lengths are `CUDNN_MIN_LENGTH` or
    more, where it is the faster; else "xla"."""
    lengths = (query.shape[1], key.shape[1])
    # A length that is a symbol (a Functional model's `None`, traced by
    # `jax.export`) cannot be compared: XLA's attention takes any length.
    if not all(isinstance(length, int) for length in lengths):
        return "xla"
    long_enough = min(lengths) >= CUDNN_MIN_LENGTH
    return "cudnn" if long_enough and cudnn_takes(query, key, platform) else "xla"


def cudnn_takes(query, key, platform=None):
    """Whether cuDNN's fused attention takes `[B, T, N, H]` queries and
    `[B, S, N, H]` keys: on a GPU, float16 or bfloat16, a head size that is
    a multiple of 8 up to 128, even lengths. `platform` defaults to JAX's."""
    import jax

    platform = platform or jax.default_backend()
    _, length, _, head_size = query.shape
    key_length = key.shape[1]
    return (
        not _xla_only
        and platform == "gpu"
        and keras.backend.standardize_dtype(query.dtype) in ("float16", "bfloat16")
        and query.dtype == key.dtype
        and head_size % 8 == 0
        and head_size <= 128
        and length % 2 == 0
        and key_length % 2 == 0
    )


def cudnn_mask(mask, query_length, key_length):
    """A boolean `[B or 1, T or 1, S]` mask as the `[B, 1, T, S]` cuDNN
    takes: every query's row written out, one head broadcast."""
    import jax.numpy as jnp

    if mask is None:
        return None
    return jnp.broadcast_to(mask, (mask.shape[0], query_length, key_length))[:, None]


def _cudnn_attention(query, key, value, mask, scale):
    """cuDNN's fused attention, or None where this GPU's cuDNN refuses it
    while tracing (an old version or chip): XLA's attention then runs."""
    import jax

    try:
        return jax.nn.dot_product_attention(
            query,
            key,
            value,
            mask=cudnn_mask(mask, query.shape[1], key.shape[1]),
            scale=scale,
            implementation="cudnn",
        )
    except (RuntimeError, ValueError, NotImplementedError) as error:
        if not _refusals:
            warnings.warn(f"cuDNN's fused attention is refused here, so XLA's runs instead: {error}", stacklevel=2)
        _refusals.append(str(error))
        return None


def attend_to_cache(query, key, value, mask, scale, decoding=None):
    """Attention of `[B, T, N, H]` queries over a `[B, N, S, H]` cache in
    torch's fused attention, while decoding float32 under torch; None
    elsewhere, where the caller writes the softmax out."""
    if decoding is None or keras.backend.backend() != "torch":
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
        mask,
        scale,
        decoding,
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


def _torch_attention(query, key, value, mask, scale, decoding):
    """torch's fused attention of `[B, N, T, H]` queries and `[B, N, S, H]`
    keys and values, the boolean mask `[B or 1, T, S]` made additive with
    Keras's stand-in for -inf (-0.7 times the dtype's largest finite
    value), once a step for the layers of a stack."""
    import torch

    if mask is not None:
        mask = memoized(decoding, ("additive", query.dtype, query.device), (mask,), lambda: _additive(mask, query))
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def _additive(mask, query):
    """The boolean `mask` as 0 (attend) or -0.7 times the largest value of
    `query`'s dtype (not)."""
    import torch

    negative_key = (query.dtype, query.device)
    if negative_key not in _large_negatives:
        largest = 65500.0 if query.dtype == torch.float16 else 3.38953e38
        _large_negatives[negative_key] = torch.tensor(largest * -0.7, dtype=query.dtype, device=query.device)
    return torch.where(mask[:, None], 0.0, _large_negatives[negative_key])  # [B or 1, 1, T, S]
