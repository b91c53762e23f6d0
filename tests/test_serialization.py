import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import layers

from conftest import random_ids, to_numpy

V = 30
D = 16


def _round_trip(model, tmp_path):
    path = str(tmp_path / "model.keras")
    model.save(path)
    return keras.saving.load_model(path)


def _layer_model(layer, *input_shapes, dtype="float32", **call_kwargs):
    inputs = [keras.Input(shape, dtype=dtype) for shape in input_shapes]
    return keras.Model(inputs, layer(*inputs, **call_kwargs))


@pytest.mark.parametrize(
    "make_model, inputs",
    [
        (
            lambda: _layer_model(layers.MultiHeadAttention(4, dropout=0.1), (5, D), (6, D)),
            [np.ones((2, 5, D)), np.arange(2 * 6 * D).reshape(2, 6, D) / 100.0],
        ),
        (
            lambda: _layer_model(layers.SinusoidalPositionEncoding(max_wavelength=500), (5, D)),
            [np.zeros((2, 5, D))],
        ),
        (
            lambda: _layer_model(layers.TokenEmbedding(V, D), (5,), dtype="int32"),
            [np.arange(10).reshape(2, 5)],
        ),
        (
            lambda: _layer_model(layers.PositionwiseFeedForward(32, activation="gelu"), (5, D)),
            [np.linspace(-1, 1, 2 * 5 * D).reshape(2, 5, D)],
        ),
        (
            lambda: _layer_model(layers.Dropout(0.2, seed=5), (5, D)),
            [np.linspace(-1, 1, 2 * 5 * D).reshape(2, 5, D)],
        ),
        (
            lambda: _layer_model(
                layers.TransformerEncoderBlock(4, 32, normalize_first=True), (5, D)
            ),
            [np.linspace(-1, 1, 2 * 5 * D).reshape(2, 5, D)],
        ),
        (
            lambda: _layer_model(layers.TransformerDecoderBlock(4, 32), (5, D), (7, D)),
            [np.linspace(-1, 1, 2 * 5 * D).reshape(2, 5, D), np.ones((2, 7, D))],
        ),
    ],
    ids=["attention", "position", "embedding", "feed_forward", "dropout", "encoder", "decoder"],
)
def test_layers_survive_keras_save_and_load(make_model, inputs, tmp_path):
    model = make_model()
    layer = model.layers[-1]
    loaded = _round_trip(model, tmp_path)
    loaded_layer = loaded.layers[-1]
    assert type(loaded_layer) is type(layer)
    assert loaded_layer.get_config() == layer.get_config()
    np.testing.assert_allclose(
        to_numpy(loaded(inputs)), to_numpy(model(inputs)), atol=1e-6
    )


def _batch():
    rng = np.random.default_rng(3)
    source_ids = random_ids(rng, (2, 6), V)
    source_ids[1, 4:] = 0
    target_ids = random_ids(rng, (2, 5), V)
    target_ids[:, 0] = 1
    return {"source_ids": source_ids, "target_ids": target_ids}


def test_compiled_model_survives_keras_save_and_load(tmp_path):
    model = kt.build_transformer(
        "tiny", vocabulary_size=V, num_layers=1, normalize_first=True,
        share_embeddings=False,
    )
    model.compile(
        optimizer=kt.optimizers.transformer_adam(64, warmup_steps=100),
        loss=kt.losses.LabelSmoothedCrossEntropy(0.2),
        metrics=[kt.metrics.MaskedTokenAccuracy(), kt.metrics.Perplexity()],
    )
    batch = _batch()
    model.fit(batch, batch["target_ids"], epochs=1, verbose=0)
    loaded = _round_trip(model, tmp_path)
    assert isinstance(loaded, kt.Transformer)
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(to_numpy(loaded(batch)), to_numpy(model(batch)), atol=1e-6)
    # The schedule resumes where it was: one update done, so step_num 2.
    assert int(to_numpy(loaded.optimizer.iterations)) == 1
    assert float(to_numpy(loaded.optimizer.learning_rate)) == pytest.approx(
        64**-0.5 * min(2**-0.5, 2 * 100**-1.5), rel=1e-6
    )
    assert loaded.loss.label_smoothing == 0.2
    # Decoding methods work on the loaded model.
    encoder_output, mask = loaded.encode(batch["source_ids"])
    cache = loaded.initial_cache(encoder_output, 5)
    logits, _ = loaded.decode_step(batch["target_ids"][:, :1], cache, 0, mask)
    np.testing.assert_allclose(
        to_numpy(logits)[:, 0], to_numpy(model(batch))[:, 0], atol=1e-5
    )


# Each pass saves and loads in the next backend: over CI's three passes, every
# backend saves a file that another loads, and loads one that another saved.
BACKENDS = ["tensorflow", "jax", "torch"]
NEXT_BACKEND = BACKENDS[(BACKENDS.index(keras.backend.backend()) + 1) % 3]


def logits_under_another_backend(model, batch, tmp_path, backend=NEXT_BACKEND):
    """`model`'s logits on `batch`, saved here and loaded under `backend` in
    a fresh process."""
    model.save(tmp_path / "model.keras")
    np.savez(tmp_path / "inputs.npz", **batch)
    script = os.path.join(os.path.dirname(__file__), "load_in_backend.py")
    result = subprocess.run(
        [sys.executable, script, str(tmp_path / "model.keras"),
         str(tmp_path / "inputs.npz"), str(tmp_path / "logits.npy")],
        env=dict(os.environ, KERAS_BACKEND=backend),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[:2] == [backend, "Transformer"]
    return np.load(tmp_path / "logits.npy")


@pytest.mark.parametrize("other_backend", [NEXT_BACKEND])
def test_keras_file_loads_under_another_backend(other_backend, tmp_path):
    model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=2)
    batch = _batch()
    np.testing.assert_allclose(
        logits_under_another_backend(model, batch, tmp_path, other_backend), to_numpy(model(batch)), atol=1e-5
    )
