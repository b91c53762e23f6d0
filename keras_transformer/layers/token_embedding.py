"""Token embeddings shared with the pre-softmax projection, section 3.4."""

import math

import keras
import numpy as np
from keras import ops
from keras import quantizers

from keras_transformer.backend import products
from keras_transformer.backend import shapes
from keras_transformer.layers.calls import DirectCalls


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(DirectCalls, keras.layers.Layer):
    """Learned token embeddings, scaled by sqrt(d_model) (section 3.4).

    The paper shares one matrix E between the source embedding, the target
    embedding and the pre-softmax linear transformation. Called on ids, the
    layer returns `E[ids] * sqrt(d_model)`. Called with `reverse=True` on
    decoder states x, it returns the logits `x E^T`. One instance used in all
    three places shares the matrix; separate instances do not.

    The default initializer draws E from N(0, d_model^-0.5), so that the
    scaled embeddings start with unit variance, of the same order as the
    position encoding they are added to.

    `quantize("int8")` (what `Model.quantize` calls) stores E as int8 with a
    scale per row, as Keras's `Embedding` does: a lookup returns the row
    dequantized, and the logits are an int8 product of the states, quantized
    per row on the fly as Keras's int8 `Dense` quantizes its inputs, with
    E's int8 rows. That last product is the largest of a decoding step (for
    the base model, 16.4 of its 38 million multiply-adds per token).

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
        float32: with `reverse`, the logits in float32, not rounded to the
            compute dtype first where the backend can (`backend/products.py`).

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
        shape = (self.vocabulary_size, self.d_model)
        if self.quantization_mode:
            self.quantized_build(shape, self.quantization_mode)
        else:
            # Read in its own dtype, not the policy's compute dtype: see call.
            self.embeddings = self.add_weight(
                shape=shape, initializer=self.embeddings_initializer, name="embeddings", autocast=False
            )
        self.built = True

    def call(self, inputs, reverse=False, float32=False, decoding=None):
        if reverse:
            table = ops.cast(self.embeddings, self.compute_dtype)
            if float32:
                return products.transposed_matmul(inputs, table, decoding)
            return products.matmul(inputs, ops.transpose(table), decoding)
        # Rows looked up in E's own dtype, then cast: the gradient of a
        # token's row then sums in float32 under mixed precision. Summed in
        # bfloat16, a frequent token's stalls (256 + 1 == 256), and on a GPU
        # the 16-bit scatter of a batch's ~25,000 rows took 20% of a base step.
        return self._scaled(ops.cast(shapes.take_rows(self.embeddings, inputs, decoding), self.compute_dtype))

    def _scaled(self, embedded):
        return embedded * ops.cast(math.sqrt(self.d_model), embedded.dtype)

    def quantize(self, mode=None, type_check=True, config=None):
        if type_check and type(self) is not TokenEmbedding:
            raise NotImplementedError(
                f"Layer {type(self).__name__} does not have a `quantize()` method implemented."
            )
        if mode != "int8":
            # A NotImplementedError: `Model.quantize` warns and leaves this
            # layer in float while quantizing the layers that take the mode
            # (int4 `Dense` kernels, say).
            raise _unsupported_mode(mode)
        matrix = self.embeddings
        del self.embeddings
        self.quantized_build(tuple(matrix.shape), mode)
        self._assign_quantized(matrix)
        self.dtype_policy = f"{mode}_from_{self.dtype_policy.name}"

    def _assign_quantized(self, matrix):
        # One scale per row: each token's embedding, and its logit's weights.
        values, scale = quantizers.AbsMaxQuantizer(axis=-1)(matrix, to_numpy=True)
        self.embeddings.assign(values)
        self.embeddings_scale.assign(ops.squeeze(scale, axis=-1))

    def load_own_variables(self, store):
        if self.quantization_mode == "int8" and len(store.keys()) == 1:
            # Saved quantized before the token embedding was (its float
            # matrix beside int8 kernels): quantized as it loads.
            matrix = np.asarray(store["0"])
            if matrix.shape != tuple(self.embeddings.shape):
                raise ValueError(
                    f"Layer '{self.name}' expected embeddings of shape "
                    f"{tuple(self.embeddings.shape)}. Received: {matrix.shape}"
                )
            self._assign_quantized(matrix)
            return
        super().load_own_variables(store)

    def quantized_build(self, embeddings_shape, mode, config=None):
        if mode != "int8":
            raise _unsupported_mode(mode)
        self._states_quantizer = quantizers.AbsMaxQuantizer(axis=-1)
        self.embeddings = self.add_weight(
            name="embeddings", shape=embeddings_shape, initializer="zeros",
            dtype="int8", trainable=False,
        )
        self.embeddings_scale = self.add_weight(
            name="embeddings_scale", shape=embeddings_shape[:1], initializer="ones",
            trainable=False,
        )
        self._is_quantized = True

    def _int8_call(self, inputs, reverse=False, float32=False, decoding=None):
        if reverse:
            states, states_scale = self._states_quantizer(inputs)
            # Each state row against each int8 row of E (rows by rows):
            # under XLA, faster than states times E transposed.
            rows = ops.reshape(states, (-1, self.d_model))
            sums = products.int8_rows_by_rows(rows, self.embeddings, decoding)  # int32
            sums = ops.reshape(sums, tuple(ops.shape(states)[:-1]) + (self.vocabulary_size,))
            logits = products.int8_rescaled(
                sums, states_scale, self.embeddings_scale, self.compute_dtype, decoding
            )
            return ops.cast(logits, "float32") if float32 else logits
        rows = ops.take(self.embeddings, inputs, axis=0)
        scale = ops.take(self.embeddings_scale, inputs, axis=0)[..., None]
        return self._scaled(ops.divide(ops.cast(rows, self.compute_dtype), scale))

    def compute_output_spec(self, inputs, reverse=False, float32=False, decoding=None):
        if reverse:
            shape = tuple(inputs.shape[:-1]) + (self.vocabulary_size,)
        else:
            shape = tuple(inputs.shape) + (self.d_model,)
        return keras.KerasTensor(shape, dtype="float32" if reverse and float32 else self.compute_dtype)

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


def _unsupported_mode(mode):
    return NotImplementedError(
        f"Invalid quantization mode for TokenEmbedding. Expected one of ('int8',). "
        f"Received: quantization_mode={mode}"
    )
