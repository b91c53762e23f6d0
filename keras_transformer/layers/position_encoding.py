"""Sinusoidal position encoding, section 3.5 of "Attention Is All You Need"."""

import keras
import numpy as np
from keras import ops

from keras_transformer.layers.calls import DirectCalls


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(DirectCalls, keras.layers.Layer):
    """The fixed sinusoidal position encoding (section 3.5).

        PE(pos, 2i)     = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model))

    Sines fill the even dimensions and cosines the odd ones. For any offset k,
    PE(pos + k) is a fixed rotation of PE(pos), which is why the paper chose
    it. The layer has no weights and no maximum length. It is computed in
    float32 whatever the compute dtype, because float16 cannot resolve the
    angles of late positions, and it is cast to the compute dtype at the end
    so that the caller can add it to the embeddings.

    Args:
        max_wavelength: the base of the geometric progression of wavelengths,
            10000 in the paper.
        **kwargs: base layer arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: `[B, T, d_model]`; only its shape is used.
        start_index: the position of the first of the T positions, so that
            step-by-step decoding encodes position `start_index` alone.

    Returns:
        The encoding, shaped like `inputs`, for the caller to add.
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.built = True

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length, d_model = shape[-2], shape[-1]
        return ops.broadcast_to(self._table(length, d_model, start_index), shape)

    def _table(self, length, d_model, start_index):
        """The encoding of positions `start_index ..` + `length`, `[T, d]`."""
        positions = ops.arange(length, dtype="float32") + ops.cast(
            start_index, "float32"
        )
        dimensions = ops.arange(d_model)
        # Dimensions 2i and 2i + 1 share the frequency 10000^(-2i / d_model).
        even_dimensions = ops.cast(dimensions - dimensions % 2, "float32")
        inverse_frequencies = ops.power(
            float(self.max_wavelength), -even_dimensions / float(d_model)
        )
        angles = positions[:, None] * inverse_frequencies[None, :]  # [T, d]
        encoding = ops.where(
            ops.equal(dimensions % 2, 0), ops.sin(angles), ops.cos(angles)
        )
        return ops.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength})
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalTable(keras.initializers.Initializer):
    """The encoding of `SinusoidalPositionEncoding` as a `[max_length,
    d_model]` table, computed in float64: the initial value of a fixed
    position table (`position_encoding="table"`), which a converted
    checkpoint overwrites with its own layout.

    Args:
        max_wavelength: the base of the wavelengths, 10000 in the paper.
    """

    def __init__(self, max_wavelength=10000):
        self.max_wavelength = max_wavelength

    def __call__(self, shape, dtype=None):
        length, d_model = shape
        dimensions = np.arange(d_model)
        inverse_frequencies = float(self.max_wavelength) ** (-(dimensions - dimensions % 2) / d_model)
        angles = np.arange(length)[:, None] * inverse_frequencies[None, :]
        table = np.where(dimensions % 2 == 0, np.sin(angles), np.cos(angles))
        return ops.convert_to_tensor(table, dtype=dtype or "float32")

    def get_config(self):
        return {"max_wavelength": self.max_wavelength}
