"""Learned position embeddings, Table 3 row (E) of "Attention Is All You Need"."""

import keras
from keras import ops

from keras_transformer.checks import assert_positions_below
from keras_transformer.layers.calls import DirectCalls


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionEmbedding(DirectCalls, keras.layers.Layer):
    """One learned vector per position, in place of the sinusoids (Table 3, E).

    The paper found the two nearly identical (section 3.5) and kept the
    sinusoids, which may let the model reach lengths longer than it saw in
    training. A learned table has no vector past its last row, so the layer
    takes at most `max_length` positions and fails clearly past them.

    It is called like `SinusoidalPositionEncoding` and returns what is added
    to the embeddings, so the model can hold either.

    Args:
        max_length: the number of positions, 0 .. max_length - 1.
        embeddings_initializer: initializer of the `[max_length, d_model]`
            table; defaults to `RandomNormal(stddev=d_model ** -0.5)`.
        **kwargs: base layer arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: `[B, T, d_model]`; only its shape is used.
        start_index: the position of the first of the T positions, so that
            step-by-step decoding embeds position `start_index` alone.

    Returns:
        The embeddings of positions `start_index .. start_index + T - 1`,
        shaped like `inputs`.
    """

    def __init__(self, max_length, embeddings_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            raise ValueError(
                f"max_length must be an integer >= 1. Received: max_length={max_length!r}"
            )
        self.max_length = max_length
        self.embeddings_initializer = (
            None if embeddings_initializer is None
            else keras.initializers.get(embeddings_initializer)
        )

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        self.position_embeddings = self.add_weight(
            shape=(self.max_length, d_model),
            initializer=self.embeddings_initializer
            or keras.initializers.RandomNormal(stddev=d_model**-0.5),
            name="position_embeddings",
        )
        self.built = True

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length = shape[-2]
        if isinstance(length, int) and isinstance(start_index, int):
            if start_index + length > self.max_length:
                raise ValueError(
                    f"The learned position embeddings cover {self.max_length} "
                    f"positions (max_length={self.max_length}). Received "
                    f"{length} positions starting at {start_index}: a "
                    "sequence of at most max_length tokens is expected."
                )
            positions = ops.arange(start_index, start_index + length)
        else:
            positions = assert_positions_below(
                ops.arange(length) + start_index, self.max_length
            )
        embedded = ops.take(self.position_embeddings, positions, axis=0)  # [T, d]
        return ops.broadcast_to(ops.cast(embedded, self.compute_dtype), shape)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "embeddings_initializer": None
                if self.embeddings_initializer is None
                else keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
