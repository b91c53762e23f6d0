"""Label-smoothed cross-entropy with its gradient written out, under JAX.

Per token, with z the logits over a vocabulary of V and log p(v) = z_v -
logsumexp(z):

    loss   = logsumexp(z) - (1 - eps) z_label - eps mean_v z_v
    d / dz = softmax(z) - (1 - eps) onehot(label) - eps / V

Differentiating `log_softmax` and the picks through autodiff leaves XLA
several passes over the `[B, T, V]` logits, the largest tensors of a
training step; written out, the forward pass is two reductions and a
gather, and the backward pass one elementwise pass. The metrics use the
same reductions (`label_logit`, `largest_logit`, `log_normalizer`), so in
a compiled step XLA computes them once for the loss and the metrics.

Only JAX takes this path: elsewhere `smoothed_cross_entropy` returns None
and the loss differentiates its formula as before.
"""

import functools

import keras
from keras import ops


# Picked and maximized in the logits' own dtype, which is exact, then cast:
# no float32 copy of the [B, T, V] logits for these two.
def label_logit(labels, logits):
    """z_label per token, float32 `[B, T]`."""
    picked = ops.take_along_axis(logits, ops.cast(labels, "int32")[..., None], axis=-1)[..., 0]
    return ops.cast(picked, "float32")


def largest_logit(logits):
    """max_v z_v per token, float32 `[B, T]`."""
    return ops.cast(ops.max(logits, axis=-1), "float32")


def log_normalizer(logits):
    """logsumexp_v z_v per token, float32 `[B, T]`."""
    peak = ops.stop_gradient(largest_logit(logits))
    # The shift by the largest logit keeps exp in range and cancels out.
    return peak + ops.log(ops.sum(ops.exp(ops.cast(logits, "float32") - peak[..., None]), axis=-1))


def negative_log_likelihood(labels, logits):
    """-log p(label) per token, float32 `[B, T]`, from the loss's own
    reductions under JAX; None elsewhere."""
    if keras.backend.backend() != "jax":
        return None
    return log_normalizer(logits) - label_logit(labels, logits)


def smoothed_cross_entropy(labels, logits, label_smoothing):
    """The loss above per token, float32 `[B, T]`, or None off JAX."""
    if keras.backend.backend() != "jax":
        return None
    return _jax_loss()(labels, logits, float(label_smoothing))


@functools.cache
def _jax_loss():
    import jax
    import jax.numpy as jnp

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
    def loss(labels, logits, eps):
        return forward(labels, logits, eps)[0]

    def forward(labels, logits, eps):
        picked, normalizer = label_logit(labels, logits), log_normalizer(logits)
        mean = jnp.mean(logits.astype(jnp.float32), axis=-1)
        return normalizer - (1.0 - eps) * picked - eps * mean, (labels, logits, normalizer)

    def backward(eps, residuals, cotangent):
        labels, logits, normalizer = residuals
        vocabulary = jnp.arange(logits.shape[-1], dtype=jnp.int32)
        target = jnp.where(labels.astype(jnp.int32)[..., None] == vocabulary, 1.0 - eps, 0.0) + eps / logits.shape[-1]
        softmax = jnp.exp(logits.astype(jnp.float32) - normalizer[..., None])
        return None, ((softmax - target) * cotangent[..., None]).astype(logits.dtype)

    loss.defvjp(forward, backward)
    return loss
