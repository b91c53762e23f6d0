"""The model chosen by validation: early stopping, the best checkpoints kept
and averaged, and a resumed run that keeps the best and the count."""

import json
import os

import keras
import numpy as np
import pytest

from keras_transformer import training
from keras_transformer.decoding import Translator
from keras_transformer.training import checkpoints as checkpoint_files
from keras_transformer.training.selection import standing

from conftest import in_one_pass
from conftest import write_reversal_files

pytestmark = in_one_pass("torch", "which checkpoint is kept and when a run stops: NumPy and files, the same under every backend")

TRAIN_STEPS = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The reversal task, with validation pairs whose targets are shuffled:
    the better the model reverses, the worse its validation loss gets."""
    directory = write_reversal_files(tmp_path_factory.mktemp("corpus"))
    targets = (directory / "valid.de").read_text().splitlines()
    shuffled = targets[1:] + targets[:1]
    (directory / "valid.de").write_text("".join(line + "\n" for line in shuffled))
    return directory


def config(corpus, model_dir, **selection):
    return training.TrainingConfig(
        model_dir=str(model_dir), train_source=[str(corpus / "train.en")], train_target=[str(corpus / "train.de")],
        valid_source=[str(corpus / "valid.en")], valid_target=[str(corpus / "valid.de")],
        vocabulary_size=320, preset="tiny", model={"num_layers": 1}, tokens_per_batch=512, max_tokens=16,
        warmup_steps=10, train_steps=TRAIN_STEPS, checkpoint_every=2, valid_bleu_sentences=0,
        valid_metrics=["loss"], beam_size=1, log_every=2, **selection,
    )


def run(configuration, lines=None, resume=False):
    return training.train_translator(configuration, resume=resume, log=(lines.append if lines is not None else lambda _: None))


def weights_of(path):
    return keras.saving.load_model(path, compile=False).get_weights()


def assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def stopped(corpus, tmp_path_factory):
    """A run with patience 3 that stops early, and its lines."""
    directory, lines = tmp_path_factory.mktemp("stopped"), []
    run(config(corpus, directory, best_metric="loss", patience=3), lines)
    return directory, lines


def test_a_run_whose_validation_worsens_stops_early_and_saves_its_best_checkpoint(stopped):
    tmp_path, lines = stopped
    history = training.read_history(tmp_path / "history.jsonl")
    last = history[-1]["step"]
    assert last < TRAIN_STEPS
    losses = {r["step"]: r["val_loss"] for r in history}
    best = min(losses, key=losses.get)
    assert [step for step in losses if step > best] == [best + 2, best + 4, best + 6] and last == best + 6
    assert any(line.startswith(f"early stopping at step {last}") and f"the best is step {best}" in line for line in lines)
    kept = checkpoint_files.list_checkpoints(tmp_path / "checkpoints" / "best")
    assert [checkpoint_files.checkpoint_step(p) for p in kept] == [best]
    assert_same(Translator.load(tmp_path).model.get_weights(), weights_of(kept[0]))
    assert history[-1]["translator"]["checkpoints"] == [os.path.basename(kept[0])]


def test_average_best_averages_exactly_the_three_best(corpus, tmp_path):
    run(config(corpus, tmp_path, best_metric="loss", patience=4, keep_best=3, average_best=3))
    three = standing(tmp_path / "history.jsonl", "loss").ranked()[:3]
    kept = checkpoint_files.list_checkpoints(tmp_path / "checkpoints" / "best")
    assert sorted(checkpoint_files.checkpoint_step(p) for p in kept) == sorted(three)
    want = [np.mean(tensors, axis=0) for tensors in zip(*(weights_of(p) for p in kept))]
    assert_same(Translator.load(tmp_path).model.get_weights(), want)
    assert json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])["translator"]["checkpoints"] == [
        checkpoint_files.CHECKPOINT_PATTERN.format(step=step) for step in three
    ]


def test_a_resume_after_a_crash_keeps_the_best_and_the_count(corpus, stopped, tmp_path, monkeypatch):
    whole = stopped[0]
    stopped = training.read_history(whole / "history.jsonl")[-1]["step"]
    best = standing(whole / "history.jsonl", "loss").best_step
    assert stopped == best + 6

    # A crash two validations after the best, after its record and before
    # its checkpoint: the resume trains that interval again, with the best
    # and one validation without improvement counted from the history.
    crashed = tmp_path / "crashed"
    write = checkpoint_files.SaveCheckpoints.on_epoch_end

    def crash_after_the_best(self, epoch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == best + 4:
            raise KeyboardInterrupt
        write(self, epoch, logs)

    monkeypatch.setattr(checkpoint_files.SaveCheckpoints, "on_epoch_end", crash_after_the_best)
    with pytest.raises(KeyboardInterrupt):
        run(config(corpus, crashed, best_metric="loss", patience=3))
    monkeypatch.undo()
    assert training.read_history(crashed / "history.jsonl")[-1]["step"] == best + 4
    lines = []
    run(config(corpus, crashed, best_metric="loss", patience=3), lines, resume=True)
    assert any(line.startswith(f"early stopping at step {stopped}") for line in lines)
    assert standing(crashed / "history.jsonl", "loss").best_step == best
    assert_same(Translator.load(crashed).model.get_weights(), Translator.load(whole).model.get_weights())

    # Resumed again once stopped, it trains nothing more.
    lines = []
    run(config(corpus, crashed, best_metric="loss", patience=3), lines, resume=True)
    assert any("stopped early" in line for line in lines)
    assert training.read_history(crashed / "history.jsonl")[-1]["step"] == stopped
