"""One layer of the encoder stack, section 3.1."""

import keras

from keras_transformer.layers.transformer_block import TransformerBlock
from keras_transformer.layers.utils import sublayer_connection


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoderBlock(TransformerBlock):
    """Self-attention, then a feed-forward network (section 3.1).

    Each sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x))), or in
    pre-LN form with `normalize_first=True`. Arguments are those of
    `TransformerBlock`.

    Call arguments:
        inputs: `[B, S, d_model]`.
        padding_mask: boolean `[B, S]`, False at padding. Padded positions
            are never attended to, so they do not change the other outputs.
        attention_mask: boolean `[B, S, S]`, merged with `padding_mask`.
        training: whether dropout is active.
        decoding: the `backend.options.DecodingOptions` of a compiled decoding call, or None.

    Returns:
        `[B, S, d_model]`.
    """

    def build(self, inputs_shape):
        self.self_attention = self._attention(
            "self_attention", window=self.attention_window
        )
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm", inputs_shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.feed_forward = self._feed_forward()
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm = self._norm("feed_forward_norm", inputs_shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def call(
        self, inputs, padding_mask=None, attention_mask=None, training=None, decoding=None
    ):
        def self_attention(x):
            return self.self_attention(
                x,
                x,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                training=training,
                decoding=decoding,
            )

        def feed_forward(x):
            return self.feed_forward(x, decoding=decoding)

        x = sublayer_connection(
            inputs,
            self_attention,
            self.self_attention_norm,
            self.self_attention_dropout,
            self.normalize_first,
            training,
            decoding,
        )
        return sublayer_connection(
            x,
            feed_forward,
            self.feed_forward_norm,
            self.feed_forward_dropout,
            self.normalize_first,
            training,
            decoding,
        )

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
