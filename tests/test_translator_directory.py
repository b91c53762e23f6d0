"""From a translator directory back to training (`Translator.load(...,
compile=True)`), and translators from presets (`Translator.from_preset`):
a translator directory, a published checkpoint converted once into the
cache, a hub id."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.cli import main
from keras_transformer.data import make_dataset, read_parallel_text

from conftest import in_one_pass, to_numpy, write_reversal_files


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A `train` run's directory: 4 steps, checkpoints at 2 and 4, and the
    files it trained on."""
    data = write_reversal_files(tmp_path_factory.mktemp("reversal"))
    model_dir = tmp_path_factory.mktemp("run") / "model"
    main([
        "train", "--model-dir", str(model_dir), "--train-source", str(data / "train.en"),
        "--train-target", str(data / "train.de"), "--valid-source", str(data / "valid.en"),
        "--valid-target", str(data / "valid.de"), "--vocabulary-size", "320", "--tokens-per-batch", "400",
        "--train-steps", "4", "--checkpoint-every", "2", "--warmup-steps", "37", "--label-smoothing", "0.2",
        "--preset", "tiny", "--num-layers", "1", "--d-model", "32", "--d-ff", "64",
    ])
    return model_dir, data


def test_a_loaded_translator_s_model_goes_on_training_as_its_run_trained_it(trained):
    model_dir, data = trained
    translator = kt.Translator.load(model_dir, compile=True)
    model = translator.model
    saved = kt.Translator.load(model_dir).model
    for ours, theirs in zip(model.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(ours, theirs)  # the translator's (averaged) weights
    # Compiled with the run's schedule and smoothing, and the newest
    # checkpoint's optimizer state: the schedule goes on at step 4.
    schedule = model.optimizer.get_config()["learning_rate"]["config"]
    assert schedule["warmup_steps"] == 37 and model.loss.label_smoothing == 0.2
    newest = keras.saving.load_model(model_dir / "checkpoints" / "ckpt-00000004.keras")
    assert int(to_numpy(model.optimizer.iterations)) == 4
    for ours, theirs in zip(model.optimizer.variables[1:], newest.optimizer.variables[1:]):
        np.testing.assert_array_equal(to_numpy(ours), to_numpy(theirs))
    batches = make_dataset(read_parallel_text(data / "train.en", data / "train.de"), translator.tokenizer, 400,
                           repeat=True, seed=0)
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(batches, steps_per_epoch=1, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and "target_tokens" not in history.history
    assert int(to_numpy(model.optimizer.iterations)) == 5
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights()))
    assert translator.translate(["abc de"])[0] is not None  # the translator decodes the model it trains


def test_without_a_run_s_files_the_paper_s_settings_compile_a_fresh_optimizer(trained, tmp_path):
    model_dir, _ = trained
    kt.Translator.load(model_dir).save(tmp_path)  # no train_config.json, no checkpoints
    model = kt.Translator.load(tmp_path, compile=True).model
    assert model.optimizer.get_config()["learning_rate"]["config"]["warmup_steps"] == 4000
    assert int(to_numpy(model.optimizer.iterations)) == 0


def test_a_translator_directory_is_its_own_preset(trained):
    model_dir, _ = trained
    preset = kt.Translator.from_preset(model_dir, beam_size=1)
    loaded = kt.Translator.load(model_dir, beam_size=1)
    assert preset.beam_size == 1 and preset.translate(["abc de fgh"]) == loaded.translate(["abc de fgh"])


def test_an_unknown_preset_says_what_a_preset_is():
    with pytest.raises(ValueError, match="Unknown preset 'base'.*translator directory.*hub id.*build_transformer"):
        kt.Translator.from_preset("base")


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    from published_fixtures import marian_directory

    directory = tmp_path_factory.mktemp("marian") / "opus-mt-en-de"
    marian_directory(directory, layers=1, eos_bias=2.5)
    return directory


@in_one_pass("torch", "the converters' NumPy code and the cache's files; each backend loads a converted model in test_convert_*.py")
def test_a_published_checkpoint_converts_once_into_the_cache(marian, tmp_path, monkeypatch):
    from published_fixtures import SENTENCES

    from keras_transformer import convert

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = kt.Translator.from_preset(marian)
    assert first.translate(SENTENCES) == convert.convert(marian, tmp_path / "converted").translate(SENTENCES)
    (cached,) = (tmp_path / "cache" / "keras-transformer" / "presets").iterdir()
    monkeypatch.setattr(convert, "convert", None)  # a second conversion would fail
    assert kt.Translator.from_preset(marian).translate(SENTENCES) == first.translate(SENTENCES)
    assert list((tmp_path / "cache" / "keras-transformer" / "presets").iterdir()) == [cached]


@in_one_pass("torch", "huggingface_hub's cache, read in a process of its own (it reads its settings when imported)")
def test_a_hub_id_converts_from_the_hub_cache_offline(marian, tmp_path, monkeypatch):
    """"hf://owner/name" through huggingface_hub: here offline, from its
    cache, as a machine without the network finds a model downloaded before."""
    snapshot = tmp_path / "hub" / "models--test-owner--opus-mt-en-de" / "snapshots" / "0123abc"
    snapshot.parent.mkdir(parents=True)
    os.symlink(marian, snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abc")
    script = (
        "import json, keras_transformer as kt\n"
        "translator = kt.Translator.from_preset('hf://test-owner/opus-mt-en-de', beam_size=1)\n"
        "print(json.dumps(translator.translate(['The old man sees the dog.'])))\n"
    )
    environment = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1",
                       XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "local"))
    expected = kt.Translator.from_preset(marian, beam_size=1).translate(["The old man sees the dog."])
    assert json.loads(done.stdout.splitlines()[-1]) == expected
    assert len(list((tmp_path / "cache" / "keras-transformer" / "presets").iterdir())) == 1
