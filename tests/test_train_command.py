"""`keras-transformer train`: parallel files in, a translator directory out;
errors before training; resumption after kill -9; the Multi30k recipe."""

import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile

import h5py
import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.training import TrainingConfig

from conftest import as_a_process, in_one_pass, needs_multi30k, upstream_multi30k, write_reversal_files
from test_recipes import recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, wait=True):
    command = [sys.executable, "-m", "keras_transformer", *map(str, args)]
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def run_in_process(capsys, *args):
    """`keras-transformer *args` run in this process (no start-up of its
    own): what it printed on stdout. A one-line error fails the test."""
    from keras_transformer.cli import main

    capsys.readouterr()  # only this command's output
    main([str(a) for a in args])
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Parallel files of a toy task (reverse six words), the training set
    gzipped. With a 320-piece vocabulary every word is one piece, so every
    batch has one shape and compiled backends compile once."""
    return write_reversal_files(tmp_path_factory.mktemp("data"), gzip_train=True)


def train_arguments(files, model_dir, *extra):
    return [
        "train",
        "--train-source", files / "train.en.gz", "--train-target", files / "train.de.gz",
        "--valid-source", files / "valid.en", "--valid-target", files / "valid.de",
        "--model-dir", model_dir, "--preset", "tiny", "--num-layers", "1",
        "--vocabulary-size", "320", "--tokens-per-batch", "512", "--max-tokens", "16",
        "--warmup-steps", "20", "--valid-bleu-sentences", "6", "--beam-size", "2",
        *map(str, extra),
    ]


PROGRESS = re.compile(
    r"^step (\d+)/(\d+) \| [\d.]+ steps/s \| [\d,]+ tok/s \| [\d,]+ tok/update \| loss ([\d.]+) \| lr [\d.e+-]+", re.M
)


def test_train_writes_a_translator_directory_the_other_commands_take(files, tmp_path, capsys):
    model_dir = tmp_path / "run"
    # In this process: the command's own process is tested after kill -9 below.
    stdout = run_in_process(capsys, *train_arguments(files, model_dir, "--train-steps", 7, "--checkpoint-every", 5,
                                                     "--average", 2, "--log-every", 2))
    steps = [int(m.group(1)) for m in PROGRESS.finditer(stdout)]
    assert steps == [2, 4, 6, 7]
    assert "ETA" in stdout
    assert "batches: 9 lengths from 8 to 16 tokens (bucket_step 1.1)" in stdout
    # Validation translates with the saved translator's search (--beam-size 2).
    assert re.search(r"checkpoint at step 5 \| valid loss [\d.]+ \| perplexity [\d.]+ \| BLEU [\d.]+ \| beam 2, alpha 0.6 on 6 sentences", stdout)
    # It stopped at exactly 7 steps, with a checkpoint there, and averaged the last two.
    kept = sorted(os.listdir(model_dir / "checkpoints"))
    assert kept == ["ckpt-00000005.keras", "ckpt-00000007.keras"]
    history = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    assert [record["step"] for record in history] == [5, 7]
    assert all({"val_loss", "val_bleu", "train_seconds"} <= set(record) for record in history)
    assert any(name.startswith("events") for _, _, names in os.walk(model_dir / "logs") for name in names)

    config = TrainingConfig.load(model_dir)
    assert config.train_steps == 7 and config.model == {"num_layers": 1}
    assert config.train_source == [str(files / "train.en.gz")]
    translator = kt.Translator.load(model_dir)
    assert (translator.beam_size, translator.max_source_length) == (2, 16)
    averaged = kt.training.average_checkpoints(kt.training.list_checkpoints(model_dir / "checkpoints"))
    with zipfile.ZipFile(model_dir / "model.keras") as archive:
        with h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as weights:
            assert "optimizer" not in weights  # a translator carries no Adam moments
    for got, want in zip(translator.model.get_weights(), averaged.get_weights()):
        np.testing.assert_array_equal(got, want)

    # The other commands take the directory as it is (run in this process).
    from keras_transformer.cli import main

    main(["translate", "--model-dir", str(model_dir), "--input", str(files / "valid.en")])
    assert len(capsys.readouterr().out.splitlines()) == 12
    main(["evaluate", "--model-dir", str(model_dir), "--source", str(files / "valid.en"),
          "--reference", str(files / "valid.de")])
    assert "BLEU = " in capsys.readouterr().out

    # A run resumes only as it was configured, but may train longer.
    changed = cli_error("train", "--resume", "--model-dir", model_dir, "--dropout", "0.2")
    assert "Cannot resume" in changed and "model: {'num_layers': 1} in the run" in changed


def test_train_then_average_in_this_process(files, tmp_path, capsys):
    """The quick tier's run of both commands: two steps, a checkpoint each,
    the translator directory, and the average of its checkpoints."""
    from keras_transformer.cli import main

    model_dir = tmp_path / "run"
    main([str(a) for a in train_arguments(files, model_dir, "--train-steps", 2, "--checkpoint-every", 1,
                                          "--valid-bleu-sentences", 0, "--average", 1, "--keep-checkpoints", 2)])
    assert [(m.group(1), m.group(2)) for m in PROGRESS.finditer(capsys.readouterr().out)] == [("2", "2")]
    kept = kt.training.list_checkpoints(model_dir / "checkpoints")
    assert [os.path.basename(path) for path in kept] == ["ckpt-00000001.keras", "ckpt-00000002.keras"]
    first, second = (keras.saving.load_model(path, compile=False).get_weights() for path in kept)
    assert not np.array_equal(first[0], second[0])  # the second step moved the weights
    for got, want in zip(kt.Translator.load(model_dir).model.get_weights(), second):  # --average 1
        np.testing.assert_array_equal(got, want)
    main(["average", *map(str, kept), "--output", str(tmp_path / "averaged.keras")])
    assert "Averaged 2 checkpoints into" in capsys.readouterr().out
    averaged = keras.saving.load_model(tmp_path / "averaged.keras", compile=False).get_weights()
    for got, a, b in zip(averaged, first, second):
        np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-6)


@in_one_pass("torch", "the configuration file and the average command; each backend's training is the test above")
def test_a_saved_configuration_repeats_the_run_and_average_takes_any_checkpoints(files, tmp_path, capsys):
    from keras_transformer.cli import main

    model_dir = tmp_path / "run"
    main([str(a) for a in train_arguments(files, model_dir, "--train-steps", 1, "--checkpoint-every", 1, "--average", 1)])
    config = TrainingConfig.load(model_dir)

    # The saved configuration repeats the run, with options overriding it.
    repeated = run_in_process(capsys, "train", "--config", model_dir / "train_config.json", "--model-dir",
                              tmp_path / "again", "--train-steps", 2, "--checkpoint-every", 1, "--buckets", 2,
                              "--average", 1, "--keep-checkpoints", 2)
    fitted = re.search(r"batches: ([12]) lengths? from (\d+) to (\d+) tokens \(fitted, buckets 2\)", repeated)
    assert fitted and int(fitted[2]) <= int(fitted[3]) <= 16, re.findall("batches.*", repeated)
    again = TrainingConfig.load(tmp_path / "again")
    assert again.to_dict() == config.to_dict() | {
        "model_dir": str(tmp_path / "again"), "train_steps": 2, "checkpoint_every": 1, "buckets": 2,
        "average": 1, "keep_checkpoints": 2,
    }
    # It kept two checkpoints, though it averaged one; `average` takes any.
    kept = kt.training.list_checkpoints(tmp_path / "again" / "checkpoints")
    assert [os.path.basename(path) for path in kept] == ["ckpt-00000001.keras", "ckpt-00000002.keras"]
    main(["average", *map(str, kept), "--output", str(tmp_path / "averaged.keras")])
    assert "Averaged 2 checkpoints into" in capsys.readouterr().out
    both = keras.saving.load_model(tmp_path / "averaged.keras", compile=False).get_weights()
    for got, want in zip(both, kt.training.average_checkpoints(kept).get_weights()):
        np.testing.assert_array_equal(got, want)
    (tmp_path / "torn.keras").write_bytes(b"")
    assert f"Cannot read the checkpoint {tmp_path / 'torn.keras'}" in cli_error("average", kept[0], tmp_path / "torn.keras", "--output", tmp_path / "x.keras")
    assert "No such checkpoint: missing.keras" in cli_error("average", "missing.keras", "--output", tmp_path / "x.keras")
    assert "--output must name a .keras file; received" in cli_error("average", kept[0], "--output", tmp_path / "x.h5")
    assert "keep_checkpoints (1) must be at least average (2)" in cli_error(*train_arguments(files, tmp_path / "k", "--average", 2, "--keep-checkpoints", 1))


def progress_losses(stdout):
    return {int(m.group(1)): float(m.group(3)) for m in PROGRESS.finditer(stdout)}


@in_one_pass("torch", "the command's checkpoints and log; each backend's exact resume is tested in-process in every pass")
def test_train_resumes_after_kill_9_and_the_loss_curve_continues(files, tmp_path, capsys):
    # No validation BLEU: greedy search costs more than these steps under
    # torch, and its resume is tested in-process (test_training.py).
    common = ["--dropout", 0, "--checkpoint-every", 10, "--log-every", 5, "--average", 3, "--valid-bleu-sentences", 0]
    # The reference run and the resumed ones in this process; the killed one is a process of its own.
    whole = run_in_process(capsys, *train_arguments(files, tmp_path / "whole", "--train-steps", 60, *common))

    killed_dir = tmp_path / "killed"
    process = cli(*train_arguments(files, killed_dir, "--train-steps", 60, *common), wait=False)
    second = killed_dir / "checkpoints" / "ckpt-00000020.keras"
    deadline = time.time() + 300
    while not second.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    stdout, _ = process.communicate()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (killed_dir / "model.keras").exists()
    done = max(kt.training.checkpoints.checkpoint_step(p)
               for p in kt.training.list_checkpoints(killed_dir / "checkpoints"))
    assert 20 <= done < 60

    # Without --resume the directory is refused; with it, the run goes on
    # from its own train_config.json alone.
    assert "Pass --resume" in cli_error(*train_arguments(files, killed_dir, "--train-steps", 60, *common))
    resumed = run_in_process(capsys, "train", "--resume", "--model-dir", killed_dir)
    assert f"resuming from ckpt-{done:08d}.keras: step {done} of 60\n" in resumed
    before, after, reference = progress_losses(stdout), progress_losses(resumed), progress_losses(whole)
    # The curve continues where the checkpoint left it, not from the start ...
    assert min(after) == done + 5 and max(after) == 60
    for step, loss in after.items():
        assert loss == pytest.approx(reference[step], rel=1e-4), step
    assert after[done + 5] < reference[5]
    for step, loss in before.items():
        assert loss == pytest.approx(reference[step], rel=1e-4), step
    # ... and ends where an uninterrupted run ends.
    history = [json.loads(line) for line in (killed_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in history][-1] == 60
    # Only the newest --average checkpoints are kept.
    kept = kt.training.list_checkpoints(killed_dir / "checkpoints")
    assert [kt.training.checkpoints.checkpoint_step(p) for p in kept] == [40, 50, 60]
    for got, want in zip(kt.Translator.load(killed_dir).model.get_weights(),
                         kt.Translator.load(tmp_path / "whole").model.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # Resumed once more, a finished run says so, trains nothing and succeeds.
    again = run_in_process(capsys, "train", "--resume", "--model-dir", killed_dir)
    assert "resuming from ckpt-00000060.keras: step 60 of 60; nothing left to train" in again
    assert not PROGRESS.search(again) and "checkpoint at step" not in again


def cli_error(*args):
    """The one-line error the command exits with, run in this process."""
    from keras_transformer.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    assert isinstance(exit_info.value.code, str), exit_info.value.code
    assert exit_info.value.code.startswith("error: ")
    return exit_info.value.code


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--train-steps", "0"], "train_steps must be an integer >= 1; received 0"),
        (["--dropout", "nan"], "model.dropout must be a number in [0, 1). Received: dropout=nan"),
        (["--alpha", "inf"], "alpha must be a number in [0, inf); received inf"),
        (["--learning-rate-scale", "-1"], "learning_rate_scale must be a number in (0, inf); received -1.0"),
        (["--bucket-step", "0.9"], "bucket_step must be a number in [1, 4]; received 0.9"),
        (["--buckets", "0"], "buckets must be an integer >= 1; received 0"),
        (["--valid-fraction", "0"], "valid_fraction must be a number in (0, 1); received 0.0"),
        (["--valid-fraction", "1"], "valid_fraction must be a number in (0, 1); received 1.0"),
        (["--valid-fraction", "0.1"], "valid_fraction holds validation pairs out of the training text files; give it without valid_source"),
        (["--buckets", "65"], "buckets must be at most 64; received 65"),
        (["--preset", "huge"], "preset must be one of"),
        (["--num-heads", "3"], "model.d_model must be divisible by num_heads, so that every head has d_k = d_model / num_heads, or key_dim must be given. Received: d_model=64, num_heads=3"),
        (["--attention-window", "-1"], "model.attention_window must be an integer >= 0 or None. Received: attention_window=-1"),
        (["--no-share-embeddings", "--normalize-first", "--key-dim", "0"], "model.key_dim must be an integer >= 1 or None. Received: key_dim=0"),
        (["--position-encoding", "learned", "--max-length", "8"], "model.max_length (8) must be at least max_tokens (16)"),
        (["--max-length", "32"], "sinusoids have no maximum"),
        (["--vocabulary", "/nonexistent"], "No vocabulary to reuse in /nonexistent"),
        (["--accumulate", "0"], "accumulate must be an integer >= 1; received 0"),
        (["--best-metric", "bleu", "--patience", "-1"], "patience must be an integer >= 0; received -1"),
        (["--best-metric", "bleu", "--keep-best", "2", "--average-best", "3"], "average_best (3) must be at most keep_best (2)"),
        (["--best-metric", "bleu", "--average", "5"], "average (5) averages the last checkpoints, and best_metric chooses the best"),
        (["--best-metric", "chrf", "--valid-metrics", "loss", "bleu"], "best_metric 'chrf' must be one of valid_metrics ['loss', 'bleu']"),
        (["--best-metric", "bleu", "--valid-bleu-sentences", "0"], "best_metric 'bleu' scores translations, which valid_bleu_sentences 0 turns off"),
        (["--patience", "3"], "patience needs best_metric"),
        (["--best-metric", "bleu4"], "best_metric must be one of ['loss', 'perplexity', 'bleu', 'chrf']; received 'bleu4'"),
        (["--valid-metrics", "loss", "ter"], "valid_metrics must name some of ['loss', 'perplexity', 'bleu', 'chrf']; received ['loss', 'ter']"),
        (["--valid-beam-size", "0"], "valid_beam_size must be an integer >= 1; received 0"),
        (["--max-epochs", "0"], "max_epochs must be an integer >= 1; received 0"),
        (["--max-time", "soon"], "max_time: expected a duration such as 90m, 2h30m or 3600 (seconds); received 'soon'"),
        (["--max-time", "0m"], "max_time: expected a duration above zero; received '0m'"),
        (["--clip-norm", "-1"], "clip_norm must be a number in (0, inf); received -1.0"),
        (["--ema", "1"], "ema must be a number in (0, 1); received 1.0"),
        (["--subword-alpha", "0"], "subword_alpha must be a number in (0, 1]; received 0.0"),
    ],
)
def test_bad_arguments_are_one_error_line_before_any_training(files, tmp_path, extra, message, capsys):
    error = cli_error(*train_arguments(files, tmp_path / "run", *extra))
    assert message in error and "\n" not in error
    assert "step " not in capsys.readouterr().out
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_train_takes_table_3_options(files, tmp_path):
    from keras_transformer.cli import main

    options = ["--key-dim", 8, "--value-dim", 24, "--position-encoding", "learned", "--attention-window", 2]
    # No validation BLEU: the translation below searches with these options (one compile, not two).
    main([str(a) for a in train_arguments(
        files, tmp_path / "run", "--train-steps", 2, "--checkpoint-every", 2, "--average", 1,
        "--valid-bleu-sentences", 0, *options
    )])  # fmt: skip
    translator = kt.Translator.load(tmp_path / "run")
    config = translator.model.get_config()
    # Learned positions reach max_tokens + max_extra_length (16 + 50).
    assert {k: config[k] for k in ("key_dim", "value_dim", "position_encoding", "max_length", "attention_window")} == {
        "key_dim": 8, "value_dim": 24, "position_encoding": "learned", "max_length": 66, "attention_window": 2
    }
    assert len(translator.translate(["abc de fgh", "ij"])) == 2


def test_bad_files_are_errors_that_name_them(files, tmp_path, capsys):
    (tmp_path / "short.de").write_text("ein Satz\n")
    mismatched = cli_error(*train_arguments(files, tmp_path / "a"), "--valid-target", tmp_path / "short.de")
    assert "has 12 lines" in mismatched and "short.de has 1 lines" in mismatched
    missing = cli_error(*train_arguments(files, tmp_path / "b"), "--train-source", tmp_path / "nope.en")
    assert "No such file: " in missing and "nope.en" in missing
    (tmp_path / "bad.en").write_bytes(b"fine\n\xff\xfe broken\n" + b"x\n" * 10)
    undecodable = cli_error(*train_arguments(files, tmp_path / "c"), "--valid-source", tmp_path / "bad.en")
    assert "bad.en:2: invalid UTF-8" in undecodable
    assert "train needs --train-source" in cli_error("train", "--model-dir", tmp_path / "d")
    assert "No training configuration at" in cli_error("train", "--resume", "--model-dir", tmp_path / "e")
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "train_config.json").write_text('{"model_dir": "x", "colour": 3}')
    assert "unknown fields ['colour']" in cli_error("train", "--config", tmp_path / "f" / "train_config.json")
    assert "step " not in capsys.readouterr().out


@in_one_pass("torch", "argument checks before any backend work")
def test_a_bad_argument_exits_without_a_traceback(files, tmp_path):
    result = cli(*train_arguments(files, tmp_path / "run", "--dropout", "1.5"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: Invalid training configuration: model.dropout must be a number in [0, 1). Received: dropout=1.5."
    )


@in_one_pass("torch", "the recipe's data, averaging and scoring; training under each backend is the quick start's test")
@needs_multi30k
def test_multi30k_recipe_smoke_mode_trains_and_scores_test2016(tmp_path, capsys, monkeypatch):
    """From Multi30k laid out as github.com/multi30k/dataset's data/task1/raw
    comes: gzipped, the test set named test_2016_flickr."""
    raw = upstream_multi30k(tmp_path)
    multi30k = recipe("multi30k_en_de", monkeypatch)
    result = as_a_process(capsys, lambda: multi30k.main(
        ["--smoke", "--direction", "de-en", "--data-dir", str(raw), "--model-dir", str(tmp_path / "run")]
    ))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["direction"] == "de-en"
    assert results["config"]["train_source"][0].endswith("train.de.gz")
    # alpha chosen on val for the saved translator, then test2016 scored at it
    tuning = results["val_alpha_tuning"]
    assert [(r["beam_size"], r["alpha"]) for r in tuning] == [(4, 0.6), (4, 1.0), (4, 1.4)]
    alpha = max(tuning, key=lambda r: r["bleu"])["alpha"]
    saved = json.loads((tmp_path / "run" / "translator.json").read_text())
    assert (saved["alpha"], saved["languages"]) == (alpha, ["de", "en"])  # the pair: train.de.gz, train.en.gz
    assert [(r["model"], r["search"]) for r in results["test2016"]] == [
        ("last checkpoint", "greedy"), ("last checkpoint", f"beam 4, alpha {alpha}"),
        ("average of last 2", "greedy"), ("average of last 2", f"beam 4, alpha {alpha}"),
    ]
    assert all(r["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a") for r in results["test2016"])
    assert len((tmp_path / "run" / "test2016.hyp").read_text().splitlines()) == 8


@in_one_pass("torch", "the files a killed run leaves and the resume from them; each backend's exact resume is tested in-process")
def test_a_run_killed_at_each_of_its_file_writes_in_turn_resumes_to_its_end(files, tmp_path):
    """Each run is killed at its k-th file write (vocabulary, prepared data,
    configuration, checkpoints, history, the final save), then the same
    command with --resume must finish it. A kill at the first two writes
    used to leave a folder that --resume refused for want of a
    configuration."""
    arguments = train_arguments(files, "RUN", "--train-steps", 1, "--checkpoint-every", 1, "--average", 1,
                                "--valid-bleu-sentences", 0)
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "train_killed_at_writes.py"), str(tmp_path), "40", *arguments],
        env=dict(os.environ, KERAS_BACKEND=keras.backend.backend(), KERAS_TRANSFORMER_QUIET="1"),
        capture_output=True, text=True, timeout=1200,
    )
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"write"')]
    assert records and records[-1]["killed"] == 0, result.stderr[-3000:]  # it reached the run's end
    killed = records[:-1]
    failed = [record for record in killed if (record["killed"], record["resumed"]) != (-signal.SIGKILL, 0)]
    assert not failed, (failed, result.stderr[-3000:])
    hit = [record["file"] for record in killed]
    for name in ("checkpoints/.write-check", "train_config.json", "subword.model", "subword.json",
                 "data/source.ids", "data/target.lengths", "data/manifest.json",
                 "checkpoints/ckpt-00000001.keras", "history.jsonl", "model.keras", "translator.json"):
        assert name in hit, (name, hit)
    for record in killed:
        run_dir = tmp_path / str(record["write"])
        assert sorted(os.listdir(run_dir / "checkpoints")) == ["ckpt-00000001.keras"]
        left = [name for _, folders, names in os.walk(run_dir) for name in folders + names
                if name.startswith((".partial-", ".write-check"))]
        assert not left, (record, left)
        assert [json.loads(line)["step"] for line in (run_dir / "history.jsonl").read_text().splitlines()] == [1]
        assert len(kt.Translator.load(run_dir).translate(["abc de"])) == 1


def checkpoint_at_step(step, path):
    """A tiny model's training checkpoint whose optimizer has taken `step` steps."""
    model = kt.build_transformer("tiny", vocabulary_size=32, num_layers=1)
    kt.training.compile_model(model)
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(step)
    model.save(path)


def test_resume_knows_its_run_by_its_folder_and_never_goes_back(files, tmp_path, monkeypatch):
    """--resume finds the run in its folder however the folder is spelled or
    wherever it was moved, and refuses a --train-steps behind the run's last
    checkpoint, without rewriting the run's configuration."""
    import dataclasses

    from keras_transformer.training.run import prepare_model_dir

    config = TrainingConfig(
        model_dir=str(tmp_path / "first"),
        train_source=[str(files / "train.en.gz")], train_target=[str(files / "train.de.gz")],
        valid_source=[str(files / "valid.en")], valid_target=[str(files / "valid.de")],
        train_steps=80,
    )
    config.save()
    (tmp_path / "first" / "checkpoints").mkdir()
    # Named for step 8, holding step 80: the step comes from what is read.
    checkpoint_at_step(80, tmp_path / "first" / "checkpoints" / "ckpt-00000008.keras")
    os.rename(tmp_path / "first", tmp_path / "moved")
    os.symlink(tmp_path / "moved", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    for spelling in ("moved", "moved/", str(tmp_path / "moved"), "link", "./link/"):
        prepare_model_dir(dataclasses.replace(config, model_dir=spelling, train_steps=120), resume=True)
        assert TrainingConfig.load("moved").model_dir == spelling

    saved = (tmp_path / "moved" / "train_config.json").read_text()
    error = cli_error("train", "--resume", "--model-dir", "link", "--train-steps", 20)
    assert "link is at step 80 (its newest readable checkpoint, ckpt-00000008.keras)" in error
    assert "--train-steps 20 would go back" in error and "--train-steps 80 or more" in error
    assert (tmp_path / "moved" / "train_config.json").read_text() == saved


def test_a_torn_vocabulary_is_made_again_before_the_first_checkpoint_and_explained_after(files, tmp_path):
    """A kill during the vocabulary's first write (before writes were atomic)
    left subword.model empty, and --resume crashed inside SentencePiece."""
    from keras_transformer.training.run import _vocabulary

    config = TrainingConfig(
        model_dir=str(tmp_path / "run"),
        train_source=[str(files / "train.en.gz")], train_target=[str(files / "train.de.gz")],
        valid_source=[str(files / "valid.en")], valid_target=[str(files / "valid.de")],
        vocabulary_size=320, train_steps=8,
    )
    config.save()
    (tmp_path / "run" / "subword.model").write_bytes(b"")
    said = []
    tokenizer = _vocabulary(config, said.append)
    assert "subword.model is empty" in said[0] and "Making it again" in said[0]
    assert kt.data.SubwordTokenizer.load(tmp_path / "run").fingerprint() == tokenizer.fingerprint()

    (tmp_path / "run" / "subword.model").write_bytes(b"")
    (tmp_path / "run" / "checkpoints").mkdir()
    checkpoint_at_step(4, tmp_path / "run" / "checkpoints" / "ckpt-00000004.keras")
    error = cli_error("train", "--resume", "--model-dir", tmp_path / "run")
    assert "subword.model is empty" in error
    assert "checkpoints (1) were trained with that vocabulary" in error and "put back subword.model" in error


@in_one_pass("torch", "file writes are the same code on every backend")
def test_a_full_disk_names_the_file_it_could_not_write_and_leaves_no_partial_file(files, tmp_path, capsys):
    """A file-size limit (RLIMIT_FSIZE) fails writes as a full disk does: the
    vocabulary and the prepared text fit under it, a checkpoint does not."""
    import resource

    def full_past_400_kb():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, do not kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))

    # No validation BLEU: a search writes no file, and costs more than these steps under torch.
    arguments = train_arguments(files, tmp_path / "run", "--train-steps", 4, "--checkpoint-every", 2,
                                "--valid-bleu-sentences", 0)
    command = [sys.executable, "-m", "keras_transformer", *map(str, arguments)]
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    full = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, preexec_fn=full_past_400_kb)
    assert full.returncode == 1
    assert full.stderr.strip().splitlines() == [
        f"error: Cannot write {tmp_path / 'run' / 'checkpoints' / 'ckpt-00000002.keras'}: File too large"
    ]
    assert not [name for _, _, names in os.walk(tmp_path / "run") for name in names if name.startswith(".partial")]
    # With room again, the same run resumes to its end (in this process).
    run_in_process(capsys, "train", "--resume", "--model-dir", tmp_path / "run")
    assert (tmp_path / "run" / "model.keras").is_file()


@in_one_pass("jax", "JAX's persistent compilation cache")
def test_a_repeated_run_under_jax_compiles_nothing_again(files, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(KERAS_BACKEND="jax", XDG_CACHE_HOME=str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "keras-transformer" / "jax"
    entries = []
    for run in ("first", "second"):
        arguments = train_arguments(files, tmp_path / run, "--train-steps", 2, "--checkpoint-every", 2,
                                    "--seed", len(entries), "--valid-bleu-sentences", 0)
        command = [sys.executable, "-m", "keras_transformer", *map(str, arguments)]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        entries.append(sorted(os.listdir(cache)))
    assert entries[0] and entries[1] == entries[0]  # the second run, another seed, found every program there


@in_one_pass("jax", "which pairs are held out, and the files; each backend's training is tested above")
def test_validation_pairs_held_out_of_the_training_files(files, tmp_path, capsys):
    arguments = train_arguments(files, tmp_path / "run", "--train-steps", 1, "--valid-fraction", 0.1)
    for option in ("--valid-source", "--valid-target"):
        del arguments[arguments.index(option) : arguments.index(option) + 2]
    stdout = run_in_process(capsys, *arguments)
    held = (tmp_path / "run" / "data" / "held_out.source").read_text().splitlines()
    assert 10 <= len(held) <= 50  # about 30 of 300
    assert f"train: {300 - len(held)} pairs" in stdout and f"valid (held out): {len(held)} pairs" in stdout
    assert TrainingConfig.load(tmp_path / "run").valid_fraction == 0.1
    # A new run in a folder prepared with another fraction, or other files, prepares again.
    from keras_transformer.training.run import _prepared_for

    config = TrainingConfig.load(tmp_path / "run")
    assert _prepared_for(config, tmp_path / "run" / "data")
    assert not _prepared_for(dataclasses.replace(config, valid_fraction=0.2), tmp_path / "run" / "data")
    assert not _prepared_for(dataclasses.replace(config, train_source=[str(files / "valid.en")]), tmp_path / "run" / "data")
    arguments[arguments.index("--valid-fraction") + 1] = "1e-9"
    arguments[arguments.index("--model-dir") + 1] = str(tmp_path / "none")
    assert "valid_fraction=1e-09 held out no pair of the training text" in cli_error(*arguments)


def test_a_partial_configuration_file_is_merged_with_the_options(files, tmp_path, monkeypatch):
    from keras_transformer import cli as command_line

    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"preset": "tiny", "train_steps": 30, "tokens_per_batch": 512, "model": {"num_layers": 1}}))
    seen = []
    monkeypatch.setattr(command_line, "train", lambda args: seen.append(command_line.training_config(args)))
    data = ["--train-source", files / "train.en.gz", "--train-target", files / "train.de.gz",
            "--valid-source", files / "valid.en", "--valid-target", files / "valid.de", "--model-dir", tmp_path / "run"]
    command_line.main(["train", "--config", str(partial), *map(str, data), "--train-steps", "40", "--num-heads", "2"])
    config = seen[0]
    assert (config.preset, config.train_steps, config.tokens_per_batch) == ("tiny", 40, 512)
    assert config.model == {"num_layers": 1, "num_heads": 2} and config.warmup_steps == TrainingConfig.warmup_steps
    assert config.train_source == [str(files / "train.en.gz")]

    partial.write_text(json.dumps({"preset": "tiny", "warmup": 10}))
    assert f"error: {partial}: unknown fields ['warmup']; a configuration takes some of ['model_dir'," in cli_error("train", "--config", partial, *data)
    partial.write_text(json.dumps({"train_steps": "ten", "train_source": 5}))
    error = cli_error("train", "--config", partial, "--model-dir", tmp_path / "run", "--train-target", "t",
                      "--valid-source", "v", "--valid-target", "v")
    assert error.startswith(f"error: {partial}: ") and "`train_source` must be a file path or a list of file paths; received 5" in error
    partial.write_text(json.dumps({"train_steps": "ten"}))
    error = cli_error("train", "--config", partial, *data)
    assert error.startswith(f"error: {partial}: ") and "train_steps must be an integer >= 1; received 'ten'" in error
    monkeypatch.undo()


@pytest.mark.parametrize("field, value, expected", [
    ("model", ["num_layers", 3], "`model` must be an object of architecture fields"),
    ("train_source", 5, "`train_source` must be a file path or a list of file paths; received 5"),
    ("train_steps", "80", "train_steps must be an integer >= 1; received '80'"),
    ("preset", ["small"], "preset must be one of ['base', 'big', 'small', 'tiny']; received ['small']"),
])
def test_a_configuration_file_with_a_wrong_type_is_one_error_naming_the_file_and_field(tmp_path, field, value, expected):
    """Wrong JSON types used to give Python's own messages ("dictionary
    update sequence element #0 has length 1; 2 is required")."""
    config = TrainingConfig(model_dir=str(tmp_path), train_source=["a.en"], train_target=["a.de"],
                            valid_source=["v.en"], valid_target=["v.de"])
    config.save()
    values = json.loads((tmp_path / "train_config.json").read_text()) | {field: value}
    (tmp_path / "train_config.json").write_text(json.dumps(values))
    error = cli_error("train", "--resume", "--model-dir", tmp_path)
    assert error.startswith(f"error: {tmp_path / 'train_config.json'}: ") and expected in error


@in_one_pass("torch", "the recipe's check of its files, before any backend work")
def test_multi30k_recipe_without_its_data_says_where_to_get_it(tmp_path, capsys, monkeypatch):
    multi30k = recipe("multi30k_en_de", monkeypatch)
    result = as_a_process(  # its exit status and output as the process's would be
        capsys, lambda: multi30k.main(["--data-dir", str(tmp_path / "nowhere"), "--model-dir", str(tmp_path / "run")])
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: no Multi30k in {tmp_path / 'nowhere'}: {tmp_path / 'nowhere' / 'train.en'} is missing; "
        "expected train, val and test2016 .en/.de (github.com/multi30k/dataset's data/task1/raw, gzipped or not), "
        "or pass --data-dir."
    )
    assert not (tmp_path / "run").exists()


@in_one_pass("jax", "the command's resume lines; reading checkpoints is tested in-process in every pass")
def test_resume_names_only_checkpoints_that_loaded_and_skips_damaged_or_refused_ones(files, tmp_path, capsys):
    common = ["--train-steps", 8, "--checkpoint-every", 4, "--average", 2, "--valid-bleu-sentences", 0, "--dropout", 0]
    # The first run in this process; the resumed one is a command, whose warnings are `warning:` lines.
    run_in_process(capsys, *train_arguments(files, tmp_path / "run", *common))

    # The newest checkpoint cut short, and a file named for a later step that
    # safe mode refuses (a Python lambda): both skipped with a warning that
    # names them, and the run resumed from the one before.
    newest = tmp_path / "run" / "checkpoints" / "ckpt-00000008.keras"
    newest.write_bytes(newest.read_bytes()[:2000])
    inputs = keras.Input((2,))
    keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2)(inputs)).save(
        tmp_path / "run" / "checkpoints" / "ckpt-00000999.keras"
    )
    resumed = cli("train", "--resume", "--model-dir", tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from ckpt-00000004.keras: step 4 of 8\n" in resumed.stdout
    assert "ckpt-00000008.keras: step" not in resumed.stdout and "999" not in resumed.stdout
    warning = re.search(r"warning: Skipped 2 checkpoint.*", resumed.stderr)
    assert warning, resumed.stderr[-3000:]
    assert re.search(r"ckpt-00000999\.keras \(.*lambda", warning.group()) and "ckpt-00000008.keras (" in warning.group()
    assert PROGRESS.search(resumed.stdout) and (tmp_path / "run" / "model.keras").exists()


@in_one_pass("torch", "the model directory's lock: file code, the same on every backend")
def test_a_second_run_into_a_directory_in_use_is_refused_and_touches_nothing(files, tmp_path, capsys):
    """A run is frozen (SIGSTOP) after its first checkpoint; another run
    pointed at its directory, new or resumed, exits with one `error:` line
    naming the first, and every file of the first stays as it was. Once
    the first is killed, its own `--resume` takes the directory again."""
    import hashlib

    model_dir = tmp_path / "run"
    first = cli(*train_arguments(files, model_dir, "--train-steps", 400, "--checkpoint-every", 5,
                                 "--valid-bleu-sentences", 0), wait=False)
    checkpoint = model_dir / "checkpoints" / "ckpt-00000005.keras"
    deadline = time.time() + 300
    while not checkpoint.exists() and time.time() < deadline and first.poll() is None:
        time.sleep(0.01)
    first.send_signal(signal.SIGSTOP)
    try:
        def hashes():
            return {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in model_dir.rglob("*") if path.is_file()}

        before = hashes()
        assert checkpoint in before, "the first run ended before its first checkpoint"
        for extra in ([], ["--resume"]):
            line = cli_error(*train_arguments(files, model_dir, "--train-steps", 400, *extra))
            assert f"{model_dir} is in use by another training run (process {first.pid} on" in line, line
            assert "\n" not in line
        assert hashes() == before
    finally:
        first.send_signal(signal.SIGKILL)
        first.send_signal(signal.SIGCONT)
        first.communicate()
    again = run_in_process(capsys, *train_arguments(files, model_dir, "--train-steps", 5, "--valid-bleu-sentences", 0),
                           "--resume")
    assert "resuming from ckpt-00000005.keras" in again
