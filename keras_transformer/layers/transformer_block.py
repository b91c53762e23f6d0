"""What the encoder and decoder blocks share: arguments, config, sub-layers."""

import keras

from keras_transformer.layers.calls import DirectCalls
from keras_transformer.layers.dense import LayerNormalization
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.utils import clone_initializer


class TransformerBlock(DirectCalls, keras.layers.Layer):
    """Base of `TransformerEncoderBlock` and `TransformerDecoderBlock`.

    Args:
        num_heads: h, the number of attention heads.
        d_ff: the inner size of the feed-forward network.
        activation: the feed-forward network's inner activation, ReLU in
            the paper.
        dropout: P_drop, applied to the output of each sub-layer before the
            residual addition (section 5.4).
        attention_dropout: dropout on the attention weights. The paper does
            not use it.
        normalize_first: False for the paper's post-LN,
            LayerNorm(x + Sublayer(x)); True for pre-LN,
            x + Sublayer(LayerNorm(x)), which trains more stably in deep or
            large-learning-rate settings. A pre-LN stack needs a final
            LayerNorm, which the model adds.
        layer_norm_epsilon: epsilon of the LayerNorms.
        key_dim: d_k, the size of each head's queries and keys. Defaults to
            d_model / num_heads (section 3.2.2).
        value_dim: d_v, the size of each head's values. Defaults to
            `key_dim`.
        attention_window: r, restricting self-attention to keys at most r
            positions from their query (section 4); None attends to all.
            Encoder-decoder attention is never restricted.
        kernel_initializer: initializer of all projection kernels.
        bias_initializer: initializer of all projection biases.
        seed: the first of the block's dropout seeds (each dropout draws from
            its own stream: `seed`, `seed + 1`, ...), or None for unseeded
            dropout.
        **kwargs: base layer arguments, such as `name` and `dtype`.
    """

    def __init__(
        self,
        num_heads,
        d_ff,
        activation="relu",
        dropout=0.1,
        attention_dropout=0.0,
        normalize_first=False,
        layer_norm_epsilon=1e-6,
        key_dim=None,
        value_dim=None,
        attention_window=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.activation = activation
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.attention_window = attention_window
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self._seeds_drawn = 0

    def _next_seed(self):
        """The seed of the next dropout the block makes, in a fixed order."""
        if self.seed is None:
            return None
        self._seeds_drawn += 1
        return self.seed + self._seeds_drawn - 1

    def _attention(self, name, window=None):
        return MultiHeadAttention(
            self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            window=window,
            dropout=self.attention_dropout,
            seed=self._next_seed(),
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def _feed_forward(self):
        return PositionwiseFeedForward(
            self.d_ff,
            activation=self.activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="feed_forward",
        )

    def _norm(self, name, inputs_shape):
        norm = LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        norm.build(inputs_shape)
        return norm

    def _dropout(self, name):
        return Dropout(
            self.dropout, seed=self._next_seed(), dtype=self.dtype_policy, name=name
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "activation": self.activation,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "normalize_first": self.normalize_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "attention_window": self.attention_window,
                "seed": self.seed,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
