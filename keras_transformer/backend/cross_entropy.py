"""Label-smoothed cross-entropy with its gradient written out, under JAX and torch.

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

Under torch, which runs each operation as its own kernel, the forward
pass is one `log_softmax` and its mean, the backward pass an `exp` and one
multiply-add, where autodiff of the formula made about twice as many
passes.

TensorFlow does not take this path: there `smoothed_cross_entropy` returns
None and the loss differentiates its formula, which XLA fuses.
"""

import functools

import keras
from keras import ops


# Picked and maximized in the logits' own dtype, which is exact, then cast:
# no float32 copy of the [B, T, V] logits for these two.
def label_logit(labels, logits):
    """z_label per token, float32 `[B, T]`."""
    if keras.backend.backend() == "torch" and _torch_tensors(labels, logits):
        # One gather: Keras's `take_along_axis` first wraps negative labels,
        # four more operations for the host to launch in a torch step.
        return logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1).float()
    picked = ops.take_along_axis(logits, ops.cast(labels, "int32")[..., None], axis=-1)[..., 0]
    return ops.cast(picked, "float32")


def _torch_tensors(*tensors):
    import torch

    return all(type(tensor) is torch.Tensor for tensor in tensors)


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
    reductions under JAX; else None."""
    if keras.backend.backend() == "jax":
        return log_normalizer(logits) - label_logit(labels, logits)
    return None


def smoothed_cross_entropy(labels, logits, label_smoothing):
    """The loss above per token, float32 `[B, T]`, or None under TensorFlow."""
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax_loss()(labels, logits, float(label_smoothing))
    if backend == "torch":
        return _torch_loss().apply(labels, logits, float(label_smoothing))
    return None


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


def prepare():
    """Makes this backend's loss function now, outside any compiled step."""
    if keras.backend.backend() == "torch":
        _torch_loss()


# torch's loss function, once made: `torch.compile` reads it as a global,
# where it would trace the making of a class through `functools.cache`.
_torch_function = None


def _torch_loss():
    global _torch_function
    if _torch_function is None:
        _torch_function = _make_torch_loss()
    return _torch_function


def _make_torch_loss():
    import torch

    class SmoothedCrossEntropy(torch.autograd.Function):
        """The loss per token."""

        @staticmethod
        def forward(ctx, labels, logits, eps):
            log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
            labels = labels.long().unsqueeze(-1)
            label_log_prob = log_probs.gather(-1, labels).squeeze(-1)
            loss = -(1.0 - eps) * label_log_prob - eps * log_probs.mean(-1)
            ctx.save_for_backward(labels, log_probs)
            ctx.eps, ctx.dtype = eps, logits.dtype
            return loss

        @staticmethod
        def backward(ctx, cotangent):
            labels, log_probs = ctx.saved_tensors
            eps, vocabulary = ctx.eps, log_probs.shape[-1]
            weight = cotangent.unsqueeze(-1).float()
            gradient = torch.exp(log_probs)
            gradient.scatter_add_(-1, labels, torch.full_like(labels, -(1.0 - eps), dtype=gradient.dtype))
            # (softmax - onehot (1 - eps) - eps / V) * cotangent, in one pass.
            torch.addcmul(weight * (-eps / vocabulary), gradient, weight, out=gradient)
            return None, gradient.to(ctx.dtype), None

    return SmoothedCrossEntropy
