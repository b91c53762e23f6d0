"""Label-smoothed cross-entropy, section 5.4."""

import math

import keras
from keras import ops

from keras_transformer.backend import cross_entropy


def log_probabilities(logits):
    """log softmax of the logits over the vocabulary, in float32.

    The loss and the perplexity metric both call this, so that where a
    training step is one compiled graph (TensorFlow with XLA) the two share
    one pass over the `[B, T, V]` logits. JAX's and torch's loss take
    `backend/cross_entropy.py`'s written-out gradient instead, which their
    metrics share.
    """
    return ops.log_softmax(ops.cast(logits, "float32"), axis=-1)


def token_log_probabilities(labels, logits):
    """log p(label) and the mean log p over the vocabulary, per token.

    log p(label) is picked out by `where` against the vocabulary's ids
    rather than by a gather or a one-hot product, for the gradient's sake:
    under TensorFlow a gather's gradient scatters into the `[B, T, V]`
    log-probabilities one entry at a time (an eighth of a base-size training
    step on a CPU), and under torch Keras builds a one-hot in int64, with a
    fill, a `where` and a cast over `[B, T, V]`. `where` is one pass on
    every backend, and XLA fuses it into the sum.

    Returns:
        `(label_log_probs, mean_log_probs)`, each float32 `[B, T]`.
    """
    log_probs = log_probabilities(logits)
    vocabulary_ids = ops.arange(log_probs.shape[-1], dtype="int32")
    is_label = ops.equal(ops.cast(labels, "int32")[..., None], vocabulary_ids)
    label_log_probs = ops.sum(ops.where(is_label, log_probs, 0.0), axis=-1)
    return label_log_probs, ops.mean(log_probs, axis=-1)


def label_negative_log_likelihood(labels, logits):
    """-log p(label) per token, float32 `[B, T]`, for metrics (no gradient).

    The log-probabilities are the loss's own (`log_probabilities`; under
    JAX, the loss's log-normalizer), so that where a training step is one
    compiled graph the metric adds only a gather; a gather is the cheapest
    pick where nothing differentiates through it. Even alone (torch's eager
    step) the one fused `log_softmax` is faster than Keras's `logsumexp`,
    which makes several passes.
    """
    fused = cross_entropy.negative_log_likelihood(labels, logits)
    if fused is not None:  # the loss's own reductions
        return fused
    return -ops.take_along_axis(
        log_probabilities(logits), ops.cast(labels, "int32")[..., None], axis=-1
    )[..., 0]


def non_padding_mask(labels, padding_id):
    """float32 `[B, T]`: 1 at real tokens, 0 at padding."""
    return ops.cast(ops.not_equal(labels, padding_id), "float32")


def _size(x):
    """The number of entries of `x`: a Python number where its shape is
    known (Keras's torch `size` takes about 300 Python calls), else a
    float32 tensor."""
    if all(isinstance(dimension, int) for dimension in x.shape):
        return float(math.prod(x.shape))
    return ops.cast(ops.size(x), "float32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against targets smoothed with eps_ls (section 5.4).

    The target distribution puts 1 - eps_ls on the label and spreads eps_ls
    uniformly over the vocabulary of V tokens:

        loss = -(1 - eps_ls) log p(label) - eps_ls * (1/V) sum_v log p(v)

    Padding positions (label == `padding_id`) are ignored, and the loss is the
    mean over the remaining tokens of the batch. "This hurts perplexity, as
    the model learns to be more unsure, but improves accuracy and BLEU."

    Args:
        label_smoothing: eps_ls, 0.1 in the paper.
        padding_id: the label id to ignore.
        name: the loss name.

    Call arguments:
        y_true: integer labels `[B, T]`.
        y_pred: logits `[B, T, V]`.
    """

    def __init__(
        self,
        label_smoothing=0.1,
        padding_id=0,
        name="label_smoothed_cross_entropy",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                "`label_smoothing` must be in [0, 1). Received: "
                f"label_smoothing={label_smoothing}"
            )
        self.label_smoothing = label_smoothing
        self.padding_id = padding_id
        # The written-out gradient's function, made here rather than where
        # `torch.compile` would trace its making (a graph break per step).
        cross_entropy.prepare()

    def call(self, y_true, y_pred):
        # Under JAX and torch with its gradient written out (backend/cross_entropy.py).
        per_token = cross_entropy.smoothed_cross_entropy(y_true, y_pred, self.label_smoothing)
        if per_token is None:
            label_log_probs, mean_log_probs = token_log_probabilities(y_true, y_pred)
            per_token = -(
                (1.0 - self.label_smoothing) * label_log_probs
                + self.label_smoothing * mean_log_probs
            )
        mask = non_padding_mask(y_true, self.padding_id)
        # Keras reduces these values to their mean over all B * T positions
        # (and scales it for distributed training). Weighting real tokens by
        # (B * T) / real_tokens makes that mean the mean over real tokens.
        positions = _size(mask)
        weights = mask * positions / ops.maximum(ops.sum(mask), 1.0)
        return per_token * weights

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "label_smoothing": self.label_smoothing,
                "padding_id": self.padding_id,
            }
        )
        return config
