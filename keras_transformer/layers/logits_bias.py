"""A learned bias on the logits, as Marian's translators have."""

import keras
from keras import ops

from keras_transformer.backend import norms
from keras_transformer.layers.calls import DirectCalls


@keras.saving.register_keras_serializable(package="keras_transformer")
class LogitsBias(DirectCalls, keras.layers.Layer):
    """Adds a learned bias b to the logits: x E^T + b.

    The paper's pre-softmax projection has no bias; Marian's (OPUS-MT's)
    has one, which a converted model keeps. The bias is float32 and added
    in float32, as the logits are computed.

    Args:
        vocabulary_size: the size of b.
        **kwargs: base layer arguments, such as `name` and `dtype`.

    Call arguments:
        logits: `[..., vocabulary_size]`.

    Returns:
        `logits + b`, in the logits' dtype.
    """

    def __init__(self, vocabulary_size, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size

    def build(self, logits_shape=None):
        self.bias = self.add_weight(
            shape=(self.vocabulary_size,), initializer="zeros", name="bias", dtype="float32", autocast=False
        )
        self.built = True

    def call(self, logits):
        return ops.add(logits, ops.cast(self.bias, logits.dtype))

    def add_to_new(self, logits, decoding=None):
        """`self(logits)` for logits just made, which no one else holds:
        under torch's direct calls the bias is added into them, with no
        second `[rows, V]` tensor."""
        biased = norms.add_bias_in_place(logits, self.bias, decoding) if self.built else None
        return self(logits, decoding=decoding) if biased is None else biased

    def compute_output_spec(self, logits):
        return keras.KerasTensor(logits.shape, dtype=logits.dtype)

    def get_config(self):
        config = super().get_config()
        config.update({"vocabulary_size": self.vocabulary_size})
        return config
