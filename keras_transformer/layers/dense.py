"""Keras's `Dense`, `EinsumDense` and `LayerNormalization`, as our layers
use them: called directly while decoding, with their products through
`backend.products`.

The float calls are Keras's arithmetic with the product taken from
`backend.products` (oneDNN under torch on the CPU). The int8 call while
decoding is Keras's int8 arithmetic (the inputs quantized per row by the
layer's own quantizer, int8 by int8 sums, rescaled by both scales) with
the int8 product taken from `backend.products` too (the `kernel` property
is the stored int8 kernel in int8 mode, without LoRA). Everything else (LoRA, weight-only quantization, other modes,
gradients) is Keras's own quantized call.
"""

import keras
from keras import ops

from keras_transformer.backend import layouts
from keras_transformer.backend import norms
from keras_transformer.backend import products
from keras_transformer.layers.calls import DirectCalls


class _ProductLayer(DirectCalls):
    def _laid_out(self, name, initializer):
        # Inside `layouts.linear_order()`, a float kernel lies in memory as
        # torch's Linear weights do (`backend/layouts.py`).
        if name == "kernel" and initializer is not None:
            return layouts.kernel_initializer(initializer, self._contracted_axes())
        return initializer

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes subclasses only when told that their float call
        # is all they change.
        super().quantize(mode, type_check=False, config=config)

    def quantized_call(self, inputs, training=None, decoding=None):
        if (
            self.quantization_mode == "int8"
            and decoding is not None
            and not self.lora_enabled
            and getattr(self, "inputs_quantizer", None) is not None
        ):
            contracted = self._contracted_axes()
            if contracted is not None:
                return self._finish(self._int8_product(inputs, contracted, decoding), decoding=decoding)
        return super().quantized_call(inputs, training=training)

    def _int8_product(self, inputs, contracted, decoding):
        rank = len(inputs.shape)
        axis = -1 if contracted == 1 else tuple(range(rank - contracted, rank))
        quantized, inputs_scale = self.inputs_quantizer(inputs, axis=axis)
        sums = products.int8_product(quantized, self.kernel, contracted, decoding)
        # The input's scale `[..., 1...]`, against the output's axes.
        output_axes = len(self.kernel.shape) - contracted
        inputs_scale = ops.reshape(
            inputs_scale, tuple(ops.shape(inputs)[: rank - contracted]) + (1,) * output_axes
        )
        return ops.divide(
            ops.cast(sums, self.compute_dtype), self._output_scale(inputs_scale)
        )

    def _finish(self, x, bias_added=False, decoding=None):
        if self.bias is not None and not bias_added:
            biased = norms.add_bias(x, self.bias, decoding)
            x = ops.add(x, self.bias) if biased is None else biased
        if self.activation is not None:
            x = self.activation(x)
        return x


class Dense(_ProductLayer, keras.layers.Dense):
    """`keras.layers.Dense`: y = activation(x W + b)."""

    def call(self, inputs, training=None, decoding=None):
        biased = products.biased_product(inputs, self.kernel, self.bias, decoding=decoding)
        if biased is not None:
            return self._finish(biased, bias_added=True, decoding=decoding)
        return self._finish(products.matmul(inputs, self.kernel, decoding), decoding=decoding)

    def _contracted_axes(self):
        return 1

    def _output_scale(self, inputs_scale):
        return ops.multiply(self.kernel_scale, inputs_scale)  # Keras's order


class EinsumDense(_ProductLayer, keras.layers.EinsumDense):
    """`keras.layers.EinsumDense`: y = activation(einsum(x, W) + b)."""

    def call(self, inputs, training=None, decoding=None):
        contracted = products.matrix_product_form(self.equation)
        biased = contracted and products.biased_product(inputs, self.kernel, self.bias, contracted, decoding)
        if biased is not None:
            return self._finish(biased, bias_added=True, decoding=decoding)
        return self._finish(products.einsum(self.equation, inputs, self.kernel, decoding), decoding=decoding)

    def _contracted_axes(self):
        return products.matrix_product_form(self.equation)

    def _output_scale(self, inputs_scale):
        return ops.multiply(inputs_scale, self.kernel_scale)  # Keras's order


class LayerNormalization(DirectCalls, keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization`, called directly while decoding
    (`backend/norms.py`)."""

    def call(self, inputs, decoding=None):
        normalized = norms.layer_norm(self, inputs, decoding)
        return super().call(inputs) if normalized is None else normalized
