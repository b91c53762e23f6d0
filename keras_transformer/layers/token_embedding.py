"""Token embeddings shared with the pre-softmax projection, section 3.4."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Learned token embeddings, scaled by sqrt(d_model) (section 3.4).

    The paper shares one matrix E between the source embedding, the target
    embedding and the pre-softmax linear transformation. Called on ids, the
    layer returns `E[ids] * sqrt(d_model)`. Called with `reverse=True` on
    decoder states x, it returns the logits `x E^T`. One instance used in all
    three places shares the matrix; separate instances do not.

    The default initializer draws E from N(0, d_model^-0.5), so that the
    scaled embeddings start with unit variance, of the same order as the
    position encoding they are added to.

    Args:
        vocabulary_size: the number of rows of E.
        d_model: the number of columns of E.
        embeddings_initializer: initializer of E; defaults to
            `RandomNormal(stddev=d_model ** -0.5)`.
        **kwargs: base layer arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: integer ids `[B, T]`, or states `[B, T, d_model]` with
            `reverse=True`.
        reverse: project states onto the vocabulary instead of embedding ids.

    Returns:
        `[B, T, d_model]` embeddings, or `[B, T, vocabulary_size]` logits.
    """

    def __init__(
        self, vocabulary_size, d_model, embeddings_initializer=None, **kwargs
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.d_model = d_model
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
            or keras.initializers.RandomNormal(stddev=d_model**-0.5)
        )

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            shape=(self.vocabulary_size, self.d_model),
            initializer=self.embeddings_initializer,
            name="embeddings",
        )
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            return ops.matmul(inputs, ops.transpose(self.embeddings))
        embedded = ops.take(self.embeddings, inputs, axis=0)
        return embedded * ops.cast(math.sqrt(self.d_model), embedded.dtype)

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            shape = tuple(inputs.shape[:-1]) + (self.vocabulary_size,)
        else:
            shape = tuple(inputs.shape) + (self.d_model,)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "d_model": self.d_model,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
