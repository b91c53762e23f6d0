"""Position-wise feed-forward network, section 3.3."""

import keras

from keras_transformer.layers.calls import DirectCalls
from keras_transformer.layers.dense import Dense
from keras_transformer.layers.utils import clone_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(DirectCalls, keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike.

    Section 3.3: two linear transformations with a ReLU in between, from
    d_model to d_ff and back.

    Args:
        d_ff: the inner size (2048 in the base model).
        activation: the inner activation, ReLU in the paper.
        kernel_initializer: initializer of W1 and W2.
        bias_initializer: initializer of b1 and b2.
        **kwargs: base layer arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: `[B, T, d_model]`.
        decoding: the `backend.options.DecodingOptions` of a compiled decoding call, or None.

    Returns:
        `[B, T, d_model]`.
    """

    def __init__(
        self,
        d_ff,
        activation="relu",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_ff = d_ff
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        self.inner_dense = Dense(
            self.d_ff,
            activation=self.activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="inner_dense",
        )
        self.inner_dense.build(inputs_shape)
        self.outer_dense = Dense(
            d_model,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="outer_dense",
        )
        self.outer_dense.build(tuple(inputs_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, inputs, decoding=None):
        return self.outer_dense(self.inner_dense(inputs, decoding=decoding), decoding=decoding)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_ff": self.d_ff,
                "activation": keras.activations.serialize(self.activation),
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
