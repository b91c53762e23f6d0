"""The WMT14 recipe runs offline, guards its model directory, and reports
bad input. (The quick start runs in test_readme.py, with the README's
examples.)"""

import os
import subprocess
import sys

import keras

import keras_transformer as kt

from conftest import WMT14, needs_wmt14, in_one_pass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


WMT14_RECIPE = os.path.join(ROOT, "recipes", "wmt14_en_de.py")


def run_wmt14(*args, backend=None):
    return subprocess.run(
        [sys.executable, WMT14_RECIPE, *map(str, args)],
        env=dict(os.environ, KERAS_BACKEND=backend or keras.backend.backend()),
        capture_output=True,
        text=True,
        timeout=900,
    )


@in_one_pass("torch", "the recipe's files and steps; training under each backend is the quick start's test")
@needs_wmt14
def test_wmt14_recipe_runs_offline_and_refuses_a_used_model_dir(tmp_path):
    common = [
        "--data-dir", WMT14, "--preset", "tiny", "--tokens-per-batch", "2048",
        "--vocabulary-size", "2000", "--checkpoint-every", "2", "--average", "2",
        "--valid-size", "16", "--test-size", "8", "--model-dir", tmp_path / "run",
    ]
    first = run_wmt14(*common, "--train-steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "sacrebleu signature: nrefs:1|case:mixed|eff:no|tok:13a" in first.stdout
    assert (tmp_path / "run" / "test_bleu.txt").read_text().startswith("BLEU = ")
    assert (tmp_path / "run" / "train_config.json").is_file()
    translator = kt.Translator.load(tmp_path / "run")
    assert translator.tokenizer.vocabulary_size == 2000
    # The same model dir is refused without --resume. (Resuming is the
    # `train` command's code, tested after kill -9 in test_train_command.py.)
    refused = run_wmt14(*common, "--train-steps", "4")
    assert refused.returncode != 0
    assert "already holds a run" in refused.stderr and "--resume" in refused.stderr


@in_one_pass("torch", "checks before any backend work")
def test_wmt14_recipe_reports_bad_input(tmp_path):
    unknown_preset = run_wmt14("--preset", "huge", "--model-dir", tmp_path / "a")
    assert unknown_preset.returncode != 0 and "invalid choice: 'huge'" in unknown_preset.stderr
    unknown_backend = run_wmt14("--model-dir", tmp_path / "a", backend="mxnet")
    assert unknown_backend.returncode != 0
    assert "error: Unknown Keras backend 'mxnet'" in unknown_backend.stderr
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "newstest2013.en").write_text("x\n")
    no_files = run_wmt14("--data-dir", tmp_path / "data", "--model-dir", tmp_path / "b")
    assert no_files.returncode != 0
    assert "lacks WMT14 files" in no_files.stderr and "Missing: newstest2008.en[.gz]" in no_files.stderr


@in_one_pass("torch", "a check before any backend work")
def test_quickstart_reports_a_vocabulary_its_corpus_cannot_give_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "recipes", "quickstart.py"), "--train-size", "50",
         "--vocabulary-size", "5000"],
        cwd=tmp_path, env=dict(os.environ, KERAS_BACKEND=keras.backend.backend()),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: SentencePiece could not train a vocabulary of 5000"), result.stderr[-2000:]
