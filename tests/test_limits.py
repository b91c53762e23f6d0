"""Runs that stop short of --train-steps: --max-epochs, --max-time (with a
checkpoint, and resumable), and --clip-norm's plumbing."""

import math

import keras
import numpy as np
import pytest

from keras_transformer import training
from keras_transformer.training.checkpoints import checkpoint_step
from keras_transformer.training.checkpoints import list_checkpoints
from keras_transformer.training.limits import parse_duration

from conftest import in_one_pass
from conftest import write_reversal_files

pytestmark = in_one_pass("torch", "when a run stops: the clock, counts and files, the same under every backend")


@pytest.mark.parametrize("text, seconds", [("90m", 5400), ("2h30m", 9000), ("1d", 86400), ("45s", 45), ("3600", 3600), ("1.5h", 5400), (120, 120)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "", "0", "-5m", "m", "1h-1m", "nan", float("inf"), True])
def test_bad_durations_say_what_was_expected(text):
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_reversal_files(tmp_path_factory.mktemp("corpus"))


def config(corpus, model_dir, **options):
    options = {"checkpoint_every": 4} | options
    return training.TrainingConfig(
        model_dir=str(model_dir), train_source=[str(corpus / "train.en")], train_target=[str(corpus / "train.de")],
        valid_source=[str(corpus / "valid.en")], valid_target=[str(corpus / "valid.de")],
        vocabulary_size=320, preset="tiny", model={"num_layers": 1}, tokens_per_batch=512, max_tokens=16,
        warmup_steps=10, valid_bleu_sentences=0, beam_size=1, log_every=1, **options,
    )


def steps(model_dir):
    return [checkpoint_step(path) for path in list_checkpoints(model_dir / "checkpoints")]


def test_max_epochs_stops_after_that_many_passes_over_the_pairs(corpus, tmp_path):
    lines = []
    training.train_translator(config(corpus, tmp_path, train_steps=1000, max_epochs=2, accumulate=3), log=lines.append)
    batches = next(int(line.split(" of ")[1].split()[0]) for line in lines if line.startswith("--max-epochs 2: "))
    assert steps(tmp_path)[-1] == math.ceil(2 * batches / 3) < 1000
    assert (tmp_path / "model.keras").is_file()


def test_max_time_stops_where_an_update_ends_with_a_checkpoint_and_a_resume_goes_on(corpus, tmp_path):
    lines = []
    training.train_translator(config(corpus, tmp_path, train_steps=100000, max_time="2s", accumulate=2), log=lines.append)
    stop = next(line for line in lines if line.startswith("stopping at step "))
    step = int(stop.split()[3].rstrip(":"))
    assert "the run's time is up (2 s); resume with --resume" in stop
    assert steps(tmp_path)[-1] == step < 100000 and (tmp_path / "model.keras").is_file()
    restored = keras.saving.load_model(list_checkpoints(tmp_path / "checkpoints")[-1])
    assert int(keras.ops.convert_to_numpy(restored.optimizer.iterations)) == step
    # Where an update ends: no batch of the next one in Keras's accumulators.
    accumulators = [v for v in restored.optimizer.variables if "gradient_accumulator" in v.path]
    assert accumulators and not any(keras.ops.convert_to_numpy(v).any() for v in accumulators)
    lines = []
    # Without the 2 s: on a busy machine the three updates may take longer.
    training.train_translator(config(corpus, tmp_path, train_steps=step + 3, accumulate=2), resume=True, log=lines.append)
    assert steps(tmp_path)[-1] == step + 3


def test_clip_norm_and_subword_alpha_reach_the_optimizer_and_the_batches(corpus, tmp_path):
    lines = []
    translator = training.train_translator(
        config(corpus, tmp_path, train_steps=2, checkpoint_every=2, clip_norm=0.5, subword_alpha=0.1), log=lines.append
    )
    checkpoint = keras.saving.load_model(list_checkpoints(tmp_path / "checkpoints")[-1])
    assert checkpoint.optimizer.global_clipnorm == 0.5
    assert any(line.startswith("batches: ") and line.endswith("segmentations drawn at alpha 0.1)") for line in lines)
    assert translator is not None


def test_ema_keeps_the_moving_average_and_saves_whichever_validates_better(corpus, tmp_path):
    lines = []
    translator = training.train_translator(
        config(corpus, tmp_path, train_steps=6, checkpoint_every=3, average=1, ema=0.5), log=lines.append
    )
    newest = keras.saving.load_model(list_checkpoints(tmp_path / "checkpoints")[-1])
    averages = [keras.ops.convert_to_numpy(a) for a in newest.optimizer.moving_averages()]
    trained = [keras.ops.convert_to_numpy(v) for v in newest.trainable_variables]
    # The checkpoint's weights stay the trained ones: the average is apart.
    assert len(averages) == len(trained) and any(abs(a - w).max() > 1e-4 for a, w in zip(averages, trained))
    line = next(line for line in lines if line.startswith("valid loss: "))
    former, smoothed = (float(part.split()[0]) for part in line[len("valid loss: "):].split(", ")[:2])
    saved = [keras.ops.convert_to_numpy(v) for v in translator.model.trainable_variables]
    want = averages if smoothed < former else trained
    assert line.endswith("the translator is the " + ("moving average" if smoothed < former else "former"))
    for got, expected in zip(saved, want, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-6)
    chosen = training.read_history(tmp_path / "history.jsonl")[-1]["translator"]["chosen"]
    assert ("moving average" in chosen) == (smoothed < former)
