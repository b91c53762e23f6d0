"""Every public layer in a user's own Functional model, on inputs of any
length and batch (`None`), under this backend: built, summarized, drawn,
trained a step, saved and reloaded to the same outputs."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer import layers

from conftest import in_one_pass, to_numpy

D = 16
VOCABULARY = 50


def ids():
    return keras.Input((None,), dtype="int32", name="ids")


def states(name="states"):
    return keras.Input((None, D), name=name)


# Each public layer (`keras_transformer.layers.__all__`, the initializer
# `SinusoidalTable` inside a table) in a small model: (inputs, outputs).
MODELS = {
    "TokenEmbedding": lambda: (lambda x: ([x], layers.TokenEmbedding(VOCABULARY, D)(x)))(ids()),
    "SinusoidalPositionEncoding": lambda: (lambda x: ([x], x + layers.SinusoidalPositionEncoding()(x)))(states()),
    "LearnedPositionEmbedding": lambda: (lambda x: ([x], x + layers.LearnedPositionEmbedding(32)(x)))(states()),
    "SinusoidalTable": lambda: (lambda x: ([x], x + layers.LearnedPositionEmbedding(
        32, embeddings_initializer=layers.SinusoidalTable(), trainable=False)(x)))(states()),
    "Dropout": lambda: (lambda x: ([x], layers.Dropout(0.1, seed=1)(x)))(states()),
    "MultiHeadAttention": lambda: (lambda x: ([x], layers.MultiHeadAttention(num_heads=4)(x, x)))(states()),
    "MultiHeadAttention-cross-causal": lambda: (lambda x, y: ([x, y], layers.MultiHeadAttention(num_heads=2, dropout=0.1)(
        x, y, use_causal_mask=True)))(states("queries"), states("keys")),
    "MultiHeadAttention-scores": lambda: (lambda x: ([x], keras.layers.Add()(
        [x, layers.MultiHeadAttention(num_heads=2)(x, x, return_attention_scores=True)[0]])))(states()),
    "PositionwiseFeedForward": lambda: (lambda x: ([x], layers.PositionwiseFeedForward(32)(x)))(states()),
    "TransformerEncoderBlock": lambda: (lambda x: ([x], layers.TransformerEncoderBlock(num_heads=2, d_ff=32)(x)))(states()),
    "TransformerDecoderBlock": lambda: (lambda x, y: ([x, y], layers.TransformerDecoderBlock(num_heads=2, d_ff=32)(x, y)))(
        states("targets"), states("encoded")),
    "LogitsBias": lambda: (lambda x: ([x], layers.LogitsBias(D)(x)))(states()),
}


def test_every_public_layer_has_a_model_here():
    covered = {name.split("-")[0] for name in MODELS}
    # TransformerBlock is the blocks' base; its subclasses stand for it.
    assert covered | {"TransformerBlock"} == set(layers.__all__)


def batch(inputs, rows, length, rng):
    return [
        rng.integers(1, VOCABULARY, (rows, length)).astype("int32") if x.dtype.startswith("int")
        else rng.normal(size=(rows, length, D)).astype("float32")
        for x in inputs
    ]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_layer_on_any_length_builds_trains_saves_and_reloads(name, tmp_path, rng):
    inputs, outputs = MODELS[name]()
    assert tuple(outputs.shape) == (None, None, D)  # computed, not compared: B and T stay unknown
    model = keras.Model(inputs, keras.layers.Dense(1)(outputs))
    summary = []
    model.summary(line_length=200, print_fn=summary.append)
    assert all(type(layer).__name__ in "".join(summary) for layer in model.layers)
    model.compile(optimizer="adam", loss="mse")
    before = [w.copy() for w in model.get_weights()]
    model.fit(batch(inputs, 3, 7, rng), np.ones((3, 7, 1)), epochs=1, verbose=0)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights()))
    model.save(tmp_path / "model.keras")
    reloaded = keras.saving.load_model(tmp_path / "model.keras")
    other = batch(inputs, 2, 11, rng)  # another batch size and length
    np.testing.assert_allclose(to_numpy(reloaded.predict(other, verbose=0)), to_numpy(model.predict(other, verbose=0)),
                               atol=1e-6)


def test_a_model_of_the_blocks_is_drawn_with_its_shapes(tmp_path):
    """`keras.utils.plot_model` (the `plot` extra's pydot, and Graphviz)
    draws the layers with their computed shapes."""
    x = states()
    y = layers.TransformerDecoderBlock(num_heads=2, d_ff=32, name="decoder")(x, layers.TransformerEncoderBlock(
        num_heads=2, d_ff=32, name="encoder")(x))
    model = keras.Model(x, y)
    dot = keras.utils.model_to_dot(model, show_shapes=True).to_string()
    assert "TransformerEncoderBlock" in dot and "TransformerDecoderBlock" in dot
    assert "(None, None, 16)" in dot
    keras.utils.plot_model(model, tmp_path / "model.png", show_shapes=True)
    assert (tmp_path / "model.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@in_one_pass("jax", "the layers' code is the same under JAX and torch; TensorFlow's backend is TensorFlow")
def test_building_and_training_under_jax_imports_no_tensorflow():
    """Where TensorFlow is installed beside another backend, building,
    compiling and fitting leave it unimported (and its log lines unprinted):
    an initializer is cloned by Keras's `clone`, not through its
    serialization, which imports TensorFlow wherever it is installed."""
    script = (
        "import sys, numpy as np, keras_transformer as kt\n"
        "model = kt.training.compile_model(kt.build_transformer('tiny', vocabulary_size=64, num_layers=1))\n"
        "ids = np.ones((2, 5), 'int32')\n"
        "model.fit({'source_ids': ids, 'target_ids': ids}, ids, verbose=0)\n"
        "print('tensorflow' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, KERAS_BACKEND="jax"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False"]


def test_build_transformer_names_every_preset():
    import keras_transformer as kt
    from keras_transformer.models.presets import PRESETS

    assert all(f'"{name}"' in kt.build_transformer.__doc__.split("Returns:")[0] for name in PRESETS)
