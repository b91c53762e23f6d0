"""The order of kernels in memory under torch (keras_transformer/backend/layouts.py)."""

import keras
import numpy as np
from conftest import in_one_pass
from conftest import to_numpy
from translation_fixtures import SENTENCES
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import source_batch
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)

from keras_transformer.backend import layouts
from keras_transformer.backend import products
from keras_transformer.backend.options import DecodingOptions
from keras_transformer.decoding import Translator
from keras_transformer.layers.dense import Dense
from keras_transformer.layers.dense import EinsumDense
from keras_transformer.layers.utils import sublayers

TORCH = keras.backend.backend() == "torch"

LAYERS = {
    # name: (a layer with a seeded kernel, its input shape, its kernel as a matrix [K, N])
    "dense": (lambda: Dense(24, kernel_initializer=keras.initializers.GlorotUniform(3)), (None, 16), (16, 24)),
    "heads in": (
        lambda: EinsumDense("td,dnh->tnh", (4, 6), bias_axes="nh", kernel_initializer=keras.initializers.GlorotUniform(3)),
        (None, 16), (16, 24),
    ),
    "heads out": (
        lambda: EinsumDense("tnh,nhd->td", (16,), bias_axes="d", kernel_initializer=keras.initializers.GlorotUniform(3)),
        (None, 4, 6), (24, 16),
    ),
}


def kernel_matrix(layer, shape):
    return keras.ops.convert_to_tensor(layer.kernel).reshape(shape) if TORCH else None


def test_kernels_made_in_linear_order_hold_keras_s_values_and_under_torch_lie_as_linear_weights():
    for name, (make, input_shape, matrix_shape) in LAYERS.items():
        keras_order = make()
        keras_order.build(input_shape)
        with layouts.linear_order():
            linear = make()
            linear.build(input_shape)
        np.testing.assert_array_equal(to_numpy(linear.kernel), to_numpy(keras_order.kernel), err_msg=name)
        assert tuple(linear.kernel.shape) == tuple(keras_order.kernel.shape)
        if TORCH:
            assert layouts.in_linear_order(kernel_matrix(linear, matrix_shape)), name
            assert not layouts.in_linear_order(kernel_matrix(keras_order, matrix_shape)), name
        # Assigning keeps the order, and reads back what was written.
        values = np.random.default_rng(0).normal(size=tuple(linear.kernel.shape)).astype("float32")
        linear.kernel.assign(values)
        np.testing.assert_array_equal(to_numpy(linear.kernel), values)
        if TORCH:
            assert layouts.in_linear_order(kernel_matrix(linear, matrix_shape)), name
    # Outside the context, nothing changes: the context is left as found.
    plain = LAYERS["dense"][0]()
    plain.build((None, 16))
    assert not TORCH or not layouts.in_linear_order(kernel_matrix(plain, (16, 24)))


def test_a_row_by_a_kernel_in_linear_order_equals_keras_s_product_and_takes_onednn_where_preferred():
    rng = np.random.default_rng(1)
    with layouts.linear_order():
        layer = Dense(512, kernel_initializer=keras.initializers.RandomNormal(seed=2))
        layer.build((None, 512))
    row = keras.ops.convert_to_tensor(rng.normal(size=(1, 1, 512)).astype("float32"))
    options = DecodingOptions(direct=TORCH)
    got = layer(row, decoding=options)
    expected = keras.ops.matmul(row, layer.kernel) + layer.bias
    np.testing.assert_allclose(to_numpy(got), to_numpy(expected), rtol=1e-4, atol=1e-4)
    if TORCH:
        kernel = keras.ops.convert_to_tensor(layer.kernel)
        onednn = products.onednn_preferred() and products.onednn_linear() is not None
        assert products.pays(row[0], kernel) == onednn
        assert not products.pays(row[0], kernel.contiguous())  # Keras's order: torch's addmm


# Elsewhere `linear_order` changes nothing: the load is the plain one that
# tests/test_translator_directory.py translates and trains in every pass.
@in_one_pass("torch", "layouts.linear_order changes no kernel outside torch")
def test_a_loaded_translator_lays_its_kernels_for_rows_translates_the_same_and_trains_the_same(
    model, tokenizer, tmp_path  # noqa: F811
):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=5)
    translator.save(tmp_path)
    loaded = Translator.load(tmp_path)
    sentences = [s for s in SENTENCES if s.strip()]
    assert loaded.translate(sentences) == translator.translate(sentences)
    dense = [layer for layer in sublayers(loaded.model) if isinstance(layer, (Dense, EinsumDense))]
    assert dense
    if TORCH:
        for layer in dense:
            depth = int(np.prod(layer.kernel.shape[: layer._contracted_axes()]))
            assert layouts.in_linear_order(kernel_matrix(layer, (depth, -1))), layer.name
    # One training step from the same weights moves both models alike.
    trained = keras.saving.load_model(tmp_path / "model.keras", compile=False)
    source = source_batch(tokenizer, sentences[:3])
    target = np.random.default_rng(3).integers(3, tokenizer.vocabulary_size, size=(3, 6)).astype("int32")
    inputs = {"source_ids": source, "target_ids": target[:, :-1]}
    for copy in (loaded.model, trained):
        copy.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        copy.train_on_batch(inputs, target[:, 1:])
    for mine, theirs in zip(loaded.model.weights, trained.weights):
        np.testing.assert_allclose(to_numpy(mine), to_numpy(theirs), rtol=1e-4, atol=1e-5, err_msg=mine.path)
