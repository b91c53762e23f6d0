"""Keras's layer normalization and bias addition, and a search's log
softmax, in torch's direct calls (a decoding call's
`DecodingOptions.direct`, `layers/calls.py`), without Keras's dispatch of
each op.

Under torch a step waits on the host, and each `keras.ops` call costs about
20 microseconds of conversions and dtype rules around the torch function; a
`LayerNormalization` call, about 200. Here the same torch functions run
with the same dtypes as Keras's torch backend gives them, so the results are
Keras's bit for bit (tests/test_calls.py compares the steps). Elsewhere, or
for inputs these do not cover, each returns None and the caller runs Keras's.
"""

import keras


def _direct_torch(decoding, *tensors):
    if not (decoding is not None and decoding.direct and keras.backend.backend() == "torch"):
        return False
    import torch

    # A float32 layer's weights are the variables' own `Parameter`s.
    return all(type(tensor) in (torch.Tensor, torch.nn.Parameter) for tensor in tensors)


def layer_norm(layer, inputs, decoding):
    """`keras.layers.LayerNormalization` `layer` on `inputs`, over the last
    axis, as Keras's torch backend computes it: in float32 at least, cast
    back to the inputs' dtype, then to the layer's compute dtype."""
    if not _direct_torch(decoding, inputs) or layer.rms_scaling or list(layer.axis) not in ([-1], [inputs.ndim - 1]):
        return None
    import torch

    original = inputs.dtype
    x = inputs if original in (torch.float32, torch.float64) else inputs.to(torch.float32)
    gamma = None if layer.gamma is None else _as(layer.gamma.value, x.dtype)
    beta = None if layer.beta is None else _as(layer.beta.value, x.dtype)
    normalized = torch.nn.functional.layer_norm(x, (x.shape[-1],), gamma, beta, layer.epsilon)
    return _as(_as(normalized, original), getattr(torch, layer.compute_dtype))


def _as(tensor, dtype):
    """`tensor.to(dtype)`, without the call where the dtype is already
    `dtype` (one operation less for a traced loop to replay, and for the
    host to dispatch, at each layer norm of a float32 step)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _bias_value(x, bias, decoding):
    """`bias`'s torch tensor where `x + bias` may skip Keras: torch's direct
    calls, and one dtype; None elsewhere."""
    if not _direct_torch(decoding, x):
        return None
    value = bias.value if isinstance(bias, keras.Variable) else bias
    return value if _direct_torch(decoding, value) and x.dtype == value.dtype else None


def add_bias(x, bias, decoding):
    """`keras.ops.add(x, bias)` where both have one dtype."""
    value = _bias_value(x, bias, decoding)
    return None if value is None else x + value


def add_bias_in_place(x, bias, decoding):
    """`x += bias`, for an `x` that its caller alone holds (a step's new
    logits): no second `[rows, V]` tensor."""
    value = _bias_value(x, bias, decoding)
    return None if value is None else x.add_(value)


def log_softmax_plus(logits, scores, decoding):
    """`scores[:, :, None] + log_softmax(logits)` as `[B, K, V]`, for
    `logits` `[B * K, V]` and `scores` `[B, K]`: a beam's extensions. torch's
    fused log softmax takes one pass over the logits where its logsumexp
    takes four (max, subtract, exp, sum), and the scores are added in place."""
    if not _direct_torch(decoding, logits, scores) or logits.dtype != scores.dtype:
        return None
    import torch

    batch_size, beam_size = scores.shape
    log_probs = torch.log_softmax(logits, dim=-1).view(batch_size, beam_size, -1)
    return log_probs.add_(scores[:, :, None])
