"""Keras's projection and normalization layers as ours use them (keras_transformer/layers/dense.py)."""

import keras
import numpy as np
import pytest
from conftest import to_numpy

import keras_transformer as kt
from keras_transformer.backend.options import DecodingOptions
from keras_transformer.layers.dense import Dense
from keras_transformer.layers.dense import EinsumDense

# The three ways a decoding call is compiled: XLA (JAX, TensorFlow with
# `jit_compile`), TensorFlow without XLA, torch with direct calls.
DECODING_CALLS = [{"xla": True}, {"float_int8": True}, {"direct": True}]


def projections():
    """Our layers' projections, built, beside Keras's own of the same
    weights: a feed-forward `Dense` with ReLU, an attention input
    projection and the attention output over concatenated heads."""
    rng = np.random.default_rng(0)
    dense, keras_dense = Dense(24, activation="relu"), keras.layers.Dense(24, activation="relu")
    for layer in (dense, keras_dense):
        layer.build((None, 16))
    heads, keras_heads = (
        layer("td,dnh->tnh", output_shape=(4, 8), bias_axes="nh") for layer in (EinsumDense, keras.layers.EinsumDense)
    )
    for layer in (heads, keras_heads):
        layer.build((None, 16))
    attention = kt.layers.MultiHeadAttention(num_heads=4, key_dim=8)
    attention.build((2, 3, 16), (2, 3, 16))
    concatenated = attention.output_dense
    keras_concatenated = keras.layers.EinsumDense("tnh,nhd->td", output_shape=(16,), bias_axes="d")
    keras_concatenated.build((None, 4, 8))
    pairs = [(dense, keras_dense), (heads, keras_heads), (concatenated, keras_concatenated)]
    for ours, keras_s in pairs:
        weights = [rng.normal(size=w.shape).astype("float32") for w in ours.get_weights()]
        ours.set_weights(weights)
        keras_s.set_weights(weights)
    inputs = [rng.normal(size=shape).astype("float32") for shape in ((5, 16), (5, 16), (5, 4, 8))]
    rows = [x[:1] for x in inputs]
    return pairs, inputs, rows


def test_the_float_calls_equal_keras_s():
    pairs, inputs, _ = projections()
    for (ours, keras_s), x in zip(pairs, inputs, strict=True):
        np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(keras_s(x)), rtol=1e-5, atol=1e-5)


def test_the_int8_calls_while_decoding_equal_keras_s_int8_calls():
    """While decoding, our int8 projections compute Keras's int8 arithmetic
    with the int8 products of `backend.products`, in each way a decoding
    call is compiled; for several rows and for one, the outputs must be
    those of Keras's own quantized layers."""
    pairs, inputs, rows = projections()
    for ours, keras_s in pairs:
        ours.quantize("int8")
        keras_s.quantize("int8")
        assert ours.quantization_mode == keras_s.quantization_mode == "int8"
    for (ours, keras_s), x, row in zip(pairs, inputs, rows, strict=True):
        for batch in (x, row):
            expected = to_numpy(keras_s(batch))
            assert np.abs(expected).max() > 0.1
            for scope in DECODING_CALLS:
                got = to_numpy(ours(batch, decoding=DecodingOptions(**scope)))
                np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=str(scope))
