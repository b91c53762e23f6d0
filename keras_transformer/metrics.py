"""Token-level metrics that ignore padding."""

import keras
from keras import ops

from keras_transformer.backend.cross_entropy import label_logit
from keras_transformer.backend.cross_entropy import largest_logit
from keras_transformer.losses import label_negative_log_likelihood, non_padding_mask


def _weighted_tokens(labels, padding_id, sample_weight):
    """float32 `[B, T]`: each real token's weight (1, or its sample's), 0
    at padding; and their sum."""
    mask = non_padding_mask(labels, padding_id)
    if sample_weight is not None:
        mask = mask * ops.cast(sample_weight, "float32")
    return mask, ops.sum(mask)


class _TokenMetric(keras.metrics.Metric):
    """Accumulates a per-token quantity and the count of real tokens.

    Subclasses define `per_token(y_true, y_pred) -> [B, T]` and `result()`.
    """

    def __init__(self, padding_id=0, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.padding_id = padding_id
        self.total = self.add_variable(
            shape=(), initializer="zeros", dtype="float32", name="total"
        )
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype="float32", name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask, tokens = _weighted_tokens(y_true, self.padding_id, sample_weight)
        self.total.assign_add(ops.sum(self.per_token(y_true, y_pred) * mask))
        self.count.assign_add(tokens)

    def mean(self):
        return self.total / ops.maximum(self.count, 1.0)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        config = super().get_config()
        config.update({"padding_id": self.padding_id})
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedTokenAccuracy(_TokenMetric):
    """The fraction of non-padding tokens whose label has the largest logit.

    A label tied with another token for the largest logit counts as right.
    """

    def __init__(self, padding_id=0, name="masked_token_accuracy", **kwargs):
        super().__init__(padding_id=padding_id, name=name, **kwargs)

    def per_token(self, y_true, y_pred):
        # The label's logit against the largest: a gather and a maximum,
        # which a compiled step shares with the loss (where `top_k` or
        # `argmax` would be one more pass over the [B, T, V] logits, and
        # Keras's float `argmax` under TensorFlow and JAX six).
        return ops.cast(ops.greater_equal(label_logit(y_true, y_pred), largest_logit(y_pred)), "float32")

    def result(self):
        return self.mean()


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(_TokenMetric):
    """exp of the mean negative log-likelihood of the non-padding labels.

    Computed on the unsmoothed distribution, as the paper reports it.
    """

    def __init__(self, padding_id=0, name="perplexity", **kwargs):
        super().__init__(padding_id=padding_id, name=name, **kwargs)

    def per_token(self, y_true, y_pred):
        return label_negative_log_likelihood(y_true, y_pred)

    def result(self):
        return ops.exp(self.mean())


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(_TokenMetric):
    """The number of non-padding target tokens seen since the last reset.

    Keras resets metrics at each epoch, so within an epoch this counts the
    tokens trained on, from which a progress log computes tokens/s.
    """

    def __init__(self, padding_id=0, name="target_tokens", **kwargs):
        super().__init__(padding_id=padding_id, name=name, **kwargs)

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(_weighted_tokens(y_true, self.padding_id, sample_weight)[1])

    def result(self):
        # A computed tensor, not the variable: JAX cannot trace a variable
        # as an output, and a multi-worker strategy cannot reduce a plain
        # read of one.
        return ops.multiply(self.count, 1.0)
