"""The recipes run offline in their smoke modes: WMT14 English-German and
English-French, Table 3's rows, and parsing; they guard their model
directories and report bad input. (The quick start runs in test_readme.py,
with the README's examples.)"""

import importlib
import json
import os
import subprocess
import sys

import keras
import pytest

import keras_transformer as kt

from conftest import PTB_SAMPLE, WMT14, as_a_process, in_one_pass, needs_multi30k, needs_ptb_sample, needs_wmt14
from conftest import upstream_multi30k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


RECIPES = os.path.join(ROOT, "recipes")
WMT14_RECIPE = os.path.join(RECIPES, "wmt14_en_de.py")


def recipe(name, monkeypatch):
    """The module of `recipes/<name>.py`, imported into this process."""
    monkeypatch.syspath_prepend(RECIPES)
    # A recipe quiets logs through the environment as it is imported; the
    # value is undone after the test, for the processes later tests start.
    monkeypatch.setenv("KERAS_TRANSFORMER_QUIET", "1")
    return importlib.import_module(name)



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
def test_wmt14_recipe_runs_offline_and_refuses_a_used_model_dir(tmp_path, capsys, monkeypatch):
    common = [
        "--data-dir", WMT14, "--preset", "tiny", "--tokens-per-device", "2048", "--tokens-per-update", "4096",
        "--vocabulary-size", "2000", "--checkpoint-every", "2", "--average", "2",
        "--valid-size", "16", "--test-size", "8", "--model-dir", tmp_path / "run",
    ]
    wmt14 = recipe("wmt14_en_de", monkeypatch)

    def run(*args):  # in this process; test_wmt14_recipe_reports_bad_input runs the script itself
        return as_a_process(capsys, lambda: wmt14.main([str(a) for a in args]))

    # The options the GPU guide gives: fitted batch lengths, logging, kept checkpoints.
    first = run(*common, "--train-steps", "2", "--buckets", "2", "--log-every", "1", "--keep-checkpoints", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "step 1/2 |" in first.stdout
    # The update's tokens from the devices found: here one CPU, two batches an update.
    assert "tokens per update: 4,096 = 1 device x 2,048 tokens x 2 batches (the paper: 8 GPUs x 3,125 tokens x 1 batch)" in first.stdout
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert (saved["buckets"], saved["log_every"], saved["keep_checkpoints"]) == (2, 1, 3)
    assert (saved["tokens_per_batch"], saved["accumulate"]) == (2048, 2)
    assert "sacrebleu signature: nrefs:1|case:mixed|eff:no|tok:13a" in first.stdout
    assert (tmp_path / "run" / "test_bleu.txt").read_text().startswith("BLEU = ")
    assert (tmp_path / "run" / "train_config.json").is_file()
    translator = kt.Translator.load(tmp_path / "run")
    assert translator.tokenizer.vocabulary_size == 2000
    # The same model dir is refused without --resume. (Resuming is the
    # `train` command's code, tested after kill -9 in test_train_command.py.)
    refused = run(*common, "--train-steps", "4")
    assert refused.returncode != 0
    assert "already holds a run" in refused.stderr and "--resume" in refused.stderr


@in_one_pass("torch", "checks before any backend work")
def test_wmt14_recipe_reports_bad_input(tmp_path, capsys, monkeypatch):
    wmt14 = recipe("wmt14_en_de", monkeypatch)

    def run(*args):  # in this process
        return as_a_process(capsys, lambda: wmt14.main([str(a) for a in args]))

    unknown_preset = run("--preset", "huge", "--model-dir", tmp_path / "a")
    assert unknown_preset.returncode != 0 and "invalid choice: 'huge'" in unknown_preset.stderr
    # The script as a process of its own: the backend is checked as it starts.
    unknown_backend = run_wmt14("--model-dir", tmp_path / "a", backend="mxnet")
    assert unknown_backend.returncode != 0
    assert "error: Unknown Keras backend 'mxnet'" in unknown_backend.stderr
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "newstest2013.en").write_text("x\n")
    no_files = run("--data-dir", tmp_path / "data", "--model-dir", tmp_path / "b")
    assert no_files.returncode != 0
    assert "lacks WMT14 files" in no_files.stderr and "Missing: newstest2008.en[.gz]" in no_files.stderr


@in_one_pass("torch", "a check before any backend work")
def test_quickstart_reports_a_vocabulary_its_corpus_cannot_give_in_one_line(tmp_path, capsys, monkeypatch):
    quickstart = recipe("quickstart", monkeypatch)
    monkeypatch.chdir(tmp_path)  # its default model directory, runs/quickstart
    result = as_a_process(
        capsys, lambda: quickstart.main(quickstart.parse_args(["--train-size", "50", "--vocabulary-size", "5000"]))
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: SentencePiece could not train a vocabulary of 5000"), result.stderr[-2000:]


@in_one_pass("torch", "the recipe's rows and table; the options it varies are tested under every backend")
@needs_multi30k
def test_table3_recipe_smoke_mode_writes_a_table_of_its_rows(tmp_path, capsys, monkeypatch):
    raw = upstream_multi30k(tmp_path)  # as the upstream download comes: gzipped
    table3 = recipe("table3", monkeypatch)

    def run(table):  # in this process
        return as_a_process(capsys, lambda: table3.main(
            ["--smoke", "--data-dir", str(raw), "--out", str(tmp_path / "runs"), "--table", str(tmp_path / table)]
        ))  # fmt: skip

    result = run("table3.md")
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "table3.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| base") or line.startswith("| E ")]
    assert len(rows) == 2
    # Row E differs from the base in its positions only, and has their weights.
    assert "| learned |" in rows[1] and "sinusoidal" in rows[0]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert float(cells[1][-2].removesuffix("M")) > float(cells[0][-2].removesuffix("M"))
    for row in cells:
        assert float(row[-4]) > 1  # a perplexity
    # A rerun finds both rows done and trains nothing.
    again = run("again.md")
    assert again.returncode == 0 and "=== row" not in again.stdout
    assert (tmp_path / "again.md").read_text() == table


@in_one_pass("torch", "the recipe's files and steps; training under each backend is the quick start's test")
def test_wmt14_en_fr_recipe_smoke_mode_runs_offline_on_local_files(tmp_path, capsys, monkeypatch):
    from keras_transformer.data import builtin_corpus

    # Any parallel text stands in for English-French here: the built-in
    # corpus, its second side named .fr.
    data = tmp_path / "data"
    data.mkdir()
    for split, size in (("train", 300), ("valid", 20), ("test", 10)):
        corpus = builtin_corpus("train", size=size, seed=len(split))
        (data / f"{split}.en").write_text("".join(s + "\n" for s in corpus.sources), encoding="utf-8")
        (data / f"{split}.fr").write_text("".join(t + "\n" for t in corpus.targets), encoding="utf-8")
    wmt14_en_fr = recipe("wmt14_en_fr", monkeypatch)
    # In this process: what the script's last line runs.
    result = as_a_process(capsys, lambda: wmt14_en_fr.wmt14_en_de.main(
        ["--smoke", "--data-dir", str(data), "--vocabulary-size", "400", "--model-dir", str(tmp_path / "run")],
        source_language="en", target_language="fr", defaults=wmt14_en_fr.EN_FR, description=wmt14_en_fr.__doc__,
    ))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test (8 sentences), beam 4, alpha 0.6: BLEU = " in result.stdout
    assert "keras-transformer export --model-dir" in result.stdout and "--name wmt14_en_fr" in result.stdout
    assert len((tmp_path / "run" / "test_translations.fr").read_text(encoding="utf-8").splitlines()) == 8
    translator = kt.Translator.load(tmp_path / "run")
    assert translator.tokenizer.vocabulary_size == 400
    assert (translator.beam_size, translator.alpha) == (4, 0.6)
    # The smoke run is the tiny preset; the recipe's own model is section
    # 6.1's: big, with P_drop 0.1, 32,000 pieces, the last 20 checkpoints.
    args = wmt14_en_fr.wmt14_en_de.parse_args(["--model-dir", "x"], wmt14_en_fr.EN_FR)
    config = wmt14_en_fr.wmt14_en_de.configuration(args, {s: [("a", "b")] for s in ("train", "valid", "test")})
    assert (config.preset, config.model, config.vocabulary_size, config.average) == ("big", {"dropout": 0.1}, 32000, 20)


def test_wmt14_pairs_name_their_tfds_dataset():
    from keras_transformer.data.wmt14 import tfds_name

    assert tfds_name("en", "fr") == tfds_name("fr", "en") == "wmt14_translate/fr-en"
    assert tfds_name("en", "de") == "wmt14_translate/de-en"
    for source, target in (("de", "fr"), ("en", "en")):
        with pytest.raises(ValueError, match="WMT14 pairs English with one other language"):
            tfds_name(source, target)


@in_one_pass("torch", "the recipe's split, training loop and scores; parsing is tested under every backend")
@needs_ptb_sample
def test_ptb_parsing_recipe_smoke_mode_trains_parses_and_scores(tmp_path, capsys, monkeypatch):
    from keras_transformer.parsing import Tree

    ptb_parsing = recipe("ptb_parsing", monkeypatch)

    def run(*extra):  # in this process
        return as_a_process(capsys, lambda: ptb_parsing.main(
            ["--smoke", "--data-dir", PTB_SAMPLE, "--model-dir", str(tmp_path / "run"), *extra]
        ))  # fmt: skip

    result = run()
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["pairs"] == {"train": 33, "trained": 33, "dev": 53, "test": 25}
    for split in ("dev", "test"):
        parsed = (tmp_path / "run" / f"{split}.parsed").read_text(encoding="utf-8").splitlines()
        assert len(parsed) == results["pairs"][split]
        for line in parsed:
            Tree.from_string(line)  # well formed
        scores = results[split]
        assert set(scores) == {"Transformer (ours)", "right-branching (S root, NP below)", "flat (one S over the words)"}
        assert all(0 <= s["labelled_f1"] <= 100 for s in scores.values())
        # Flat trees: one bracket each, always right (precision 100 or near).
        assert scores["flat (one S over the words)"]["labelled_precision"] > 90
    refused = run()
    assert refused.returncode != 0 and "already holds a run" in refused.stderr
    # The run writes words as themselves; resuming it as XX would mix the two.
    refused = run("--resume", "--target-words", "XX")
    assert refused.returncode != 0 and "resume it with --target-words copied" in refused.stderr
    assert "Traceback" not in refused.stderr
