"""Smoke tests of the benchmark tools: each runs a step or two end to end on
data small enough for seconds, and reports what it promises. The timings
themselves are never asserted: the machines are shared and noisy. Each tool
runs once as a command; its other runs call its `main` in this process. And
the folder's layout: a few tools, each saying how it is run, and no results
file that nothing names."""

import ast
import glob
import importlib.util
import itertools
import json
import os
import re
import signal
import subprocess
import sys
from unittest import mock

import keras
import pytest
from conftest import as_a_process, in_one_pass

import keras_transformer as kt
from keras_transformer.data import builtin_corpus

ROOT = os.path.join(os.path.dirname(__file__), "..")
BENCHMARKS = os.path.join(ROOT, "benchmarks")

# The tools' own code is the same under every backend; the model code they
# drive is tested in every pass.
pytestmark = in_one_pass("torch", "benchmark tools' smoke runs")

# `_support.fit_batches` fits on a `tf.data` dataset, of which Keras warns that
# `fit` does not shuffle it; a command's run prints that to its stderr.
fits_in_process = pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning")


@pytest.fixture(scope="module")
def parallel_files(tmp_path_factory):
    """train.en / train.de in a folder, as Multi30k's, from the built-in corpus."""
    folder = tmp_path_factory.mktemp("corpus")
    corpus = builtin_corpus("train", size=600)
    (folder / "train.en").write_text("\n".join(corpus.sources) + "\n")
    (folder / "train.de").write_text("\n".join(corpus.targets) + "\n")
    return folder


def run_benchmark(script, *arguments, backend=None, returncode=0):
    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, script), *arguments],
        env=dict(os.environ, KERAS_BACKEND=backend or keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == returncode, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout if returncode == 0 else result.stderr


def run_in_process(capsys, script, *arguments, returncode=0):
    """`run_benchmark`, but the tool's `main` runs in this process, which
    saves the seconds of a start-up (each tool also runs as a command, in a
    test of its own). The environment and the SIGTERM handler the tool sets
    are put back."""
    path = os.path.join(BENCHMARKS, script)
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)  # the tools import their sibling `_support`, as a command's folder
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with mock.patch.dict(os.environ), mock.patch.object(sys, "argv", [path, *arguments]):
            spec = importlib.util.spec_from_file_location(os.path.splitext(script)[0], path)
            tool = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(tool)
            result = as_a_process(capsys, tool.main)
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert result.returncode == returncode, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout if returncode == 0 else result.stderr


# === The folder ===


def test_benchmarks_are_at_most_ten_tools_and_one_helper_each_tool_saying_how_it_runs():
    files = sorted(glob.glob(os.path.join(BENCHMARKS, "*.py")) + glob.glob(os.path.join(BENCHMARKS, "*.sh")))
    names = [os.path.basename(path) for path in files]
    assert len(names) <= 11, names
    assert [name for name in names if name.startswith("_")] == ["_support.py"]
    for path, name in zip(files, names):
        if name.startswith("_"):
            continue
        with open(path, encoding="utf-8") as file:
            source = file.read()
        if name.endswith(".py"):
            docstring = ast.get_docstring(ast.parse(source)) or ""
        else:  # a shell script's leading comment
            docstring = "\n".join(line for line in source.splitlines()[1:] if line.startswith("#"))
        assert re.search(rf"(python3?|bash) benchmarks/{re.escape(name)}", docstring), (
            f"{name}'s docstring gives no command (`python benchmarks/{name} ...`)"
        )


def test_every_results_file_is_named_by_a_doc_a_tool_or_a_test():
    sources = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "saved_models", "README.md"),
               os.path.join(BENCHMARKS, "README.md")]
    for pattern in (("docs", "*.md"), ("benchmarks", "*.py"), ("tests", "*.py")):
        sources += glob.glob(os.path.join(ROOT, *pattern))
    text = ""
    for path in sources:
        with open(path, encoding="utf-8") as file:
            text += file.read()
    results = sorted(os.listdir(os.path.join(BENCHMARKS, "results")))
    assert results
    # A name, not the tail of a longer one (engines_jax.json in converted_engines_jax.json).
    unnamed = [name for name in results if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]
    assert not unnamed, f"results files that no doc, tool or test names: {unnamed}"
    # A name says what was run, never at which commit.
    hashed = [name for name in results if any(
        re.fullmatch(r"[0-9a-f]{7,12}", part) and not part.isdigit() for part in re.split(r"[_.-]", name)
    )]
    assert not hashed, f"results files named after a commit: {hashed}"


def test_the_benchmarks_readme_is_a_summary_without_commits_or_issues():
    with open(os.path.join(BENCHMARKS, "README.md"), encoding="utf-8") as file:
        readme = file.read()
    assert len(readme.splitlines()) <= 300
    hexadecimal = [word for word in re.findall(r"\b[0-9a-f]{7,12}\b", readme) if not word.isdigit()]
    assert not hexadecimal, f"commit hashes in benchmarks/README.md: {hexadecimal}"
    assert not re.search(r"issue [0-9]+", readme, re.IGNORECASE)
    # Every tool the README runs is in the folder.
    for name in set(re.findall(r"benchmarks/(\w+\.(?:py|sh))", readme)):
        assert os.path.exists(os.path.join(BENCHMARKS, name)), name


# === Training ===


def test_input_pipeline_sets_the_pipeline_against_a_preset_s_training(parallel_files, tmp_path):
    out = tmp_path / "pipeline.json"
    stdout = run_benchmark(
        "input_pipeline.py", "--data-dir", str(parallel_files), "--vocabulary-size", "500",
        "--tokens-per-batch", "512", "--train-steps", "7", "--json", str(out),
    )
    report = json.loads(out.read_text())
    assert 0.9 <= report["round_trip_exact"] <= 1  # the built-in corpus's lines come back
    assert 0 < report["batches"]["padding_fraction"] < 1
    assert report["pipeline_tokens_per_second"] > 0 and report["training_tokens_per_second"] > 0
    assert report["pipeline/training"] == pytest.approx(
        report["pipeline_tokens_per_second"] / report["training_tokens_per_second"]
    )
    assert "tiny model training:" in stdout and "ratio pipeline / training" in stdout


@fits_in_process
def test_input_pipeline_bucketing_reports_padding_and_tokens_per_second(parallel_files, tmp_path, capsys):
    out = tmp_path / "bucketing.json"
    stdout = run_in_process(
        capsys, "input_pipeline.py", "--bucketing", "--data-dir", str(parallel_files), "--vocabulary-size", "500",
        "--tokens-per-batch", "512", "--steps", "1", "--rounds", "1", "--json", str(out),
    )
    report = json.loads(out.read_text())
    bucketed, padded = report["bucketed"], report["padded"]
    # Bucketing groups pairs of like length: less padding than batches of
    # pairs in random order, each padded to its longest sentence.
    assert 0 <= bucketed["padding_fraction"] < padded["padding_fraction"] < 1
    assert bucketed["target_tokens_per_second"] > 0 and padded["target_tokens_per_second"] > 0
    assert report["bucketed/padded"] == pytest.approx(
        bucketed["target_tokens_per_second"] / padded["target_tokens_per_second"]
    )
    assert "bucketed / padded" in stdout and "round trip" not in stdout


@fits_in_process
def test_precision_speed_runs_both_precisions(parallel_files, tmp_path, capsys):
    out = tmp_path / "precision.json"
    stdout = run_in_process(
        capsys, "precision.py", "--data-dir", str(parallel_files), "--vocabulary-size", "500",
        "--tokens-per-batch", "512", "--steps", "1", "--rounds", "1", "--json", str(out),
    )
    report = json.loads(out.read_text())
    medians = report["median_step_seconds"]
    assert report["mixed_bfloat16/float32"] == pytest.approx(medians["float32"] / medians["mixed_bfloat16"])
    assert "mixed_bfloat16 speedup over float32" in stdout
    assert f"{keras.backend.backend()} float32:" in stdout


def test_precision_matmul_peak_reports_both_dtypes_and_trains_nothing(tmp_path):
    out = tmp_path / "peak.json"
    # The tool's start-up as a command, under JAX, whose start-up is the quickest.
    stdout = run_benchmark(
        "precision.py", "--matmul-peak", "--sizes", "64", "--seconds", "0.05", "--json", str(out), backend="jax"
    )
    rates = json.loads(out.read_text())["flops_per_second"]["64"]
    assert rates["float32"] > 0 and rates["bfloat16"] > 0
    assert f"| 64 | {rates['float32'] / 1e9:,.0f} |" in stdout
    assert "speedup" not in stdout


# === Decoding ===


def test_decoding_engines_time_every_contender_on_the_same_steps(tmp_path, capsys):
    out = tmp_path / "engines.json"
    stdout = run_in_process(
        capsys, "decoding_engines.py", "--presets", "tiny", "--batch-sizes", "2", "--source-length", "3",
        "--output-length", "6", "--vocabulary-size", "300", "--rounds", "1", "--settle", "0",
        "--peers", "keras-hub", "transformers", "ctranslate2", "recomputed", "--json", str(out),
    )
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert "latency" not in report  # without --latency, the batch cells alone
    rows = run["contenders"]
    # Each system decoded exactly 6 tokens per sentence, or the tool would
    # have stopped: greedy and beam 4, float32 and int8.
    expected = {
        "ours", "ours, beam 4", "ours int8", "ours int8, beam 4",
        "ours recomputed", "ours recomputed, beam 4",
        "keras-hub GreedySampler", "keras-hub BeamSampler",
        "transformers generate", "transformers generate, beam 4",
        "ctranslate2 float32", "ctranslate2 float32, beam 4",
        "ctranslate2 int8", "ctranslate2 int8, beam 4",
    }
    assert set(rows) == expected
    # Every peer is set against ours with the same search and precision.
    for name, row in rows.items():
        mine = "ours" + (" int8" if row["precision"] == "int8" else "")
        mine += ", beam 4" if row["search"] == "beam 4" else ""
        if name == mine:
            assert "ours/this" not in row
            continue
        assert row["ours/this"] == pytest.approx(rows[mine]["sentences_per_second"] / row["sentences_per_second"])
    assert "| ctranslate2 int8, beam 4 | beam 4 | int8 |" in stdout


def test_decoding_engines_time_only_the_peers_asked_for(tmp_path, capsys):
    """The GPU rows' command (ours against transformers alone), here on the CPU."""
    out = tmp_path / "engines.json"
    run_in_process(
        capsys, "decoding_engines.py", "--presets", "tiny", "--batch-sizes", "2", "--source-length", "3",
        "--output-length", "6", "--vocabulary-size", "300", "--rounds", "1", "--settle", "0",
        "--peers", "transformers", "--precisions", "float32", "--json", str(out),
    )
    (run,) = json.loads(out.read_text())["runs"]
    rows = run["contenders"]
    assert set(rows) == {"ours", "ours, beam 4", "transformers generate", "transformers generate, beam 4"}
    for search in ("", ", beam 4"):
        peer = rows["transformers generate" + search]
        assert peer["ours/this"] == pytest.approx(rows["ours" + search]["sentences_per_second"] / peer["sentences_per_second"])


def test_decoding_engines_time_a_converted_translator_against_its_own_engines_in_batches_and_one_sentence_at_a_time(
    tmp_path, capsys
):
    sentences = tmp_path / "sentences.en"
    # Shortest first: the 5 timed sentences need fewer length buckets, each a program to warm up.
    sentences.write_text("\n".join(sorted(builtin_corpus("test", size=40).sources, key=len)) + "\n")
    out = tmp_path / "converted.json"
    # One run for both: with --batch-sizes, --latency follows the batch cells.
    stdout = run_in_process(
        capsys, "decoding_engines.py", "--converted", "tiny", "--latency", "5", "--latency-source", str(sentences),
        "--batch-sizes", "2", "--source-length", "3", "--output-length", "8", "--rounds", "1", "--settle", "0",
        "--json", str(out),
    )
    report = json.loads(out.read_text())
    assert report["model"]["activation_function"] == "swish"
    (run,) = report["runs"]
    cells = run["contenders"]
    peers = {"transformers generate": "ours", "ctranslate2 float32": "ours", "ctranslate2 int8": "ours int8"}
    assert {name + search for name in {"ours", "ours int8"} | set(peers) for search in ("", ", beam 4")} == set(cells)
    for search in ("", ", beam 4"):
        for name, mine in peers.items():
            row, ours = cells[name + search], cells[mine + search]
            # Each peer against ours in its precision: CTranslate2's int8 against ours in int8.
            assert row["ours/this"] == pytest.approx(ours["sentences_per_second"] / row["sentences_per_second"])
    assert cells["ours int8"]["precision"] == "int8"
    assert "tiny's size, converted, batch 2" in stdout

    latency = report["latency"]
    assert (latency["sentences"], latency["beam_size"]) == (5, 1)
    # Every engine decoded each sentence to its source's tokens + 1, or the tool would have stopped.
    assert 3 <= latency["lengths"]["min"] <= latency["lengths"]["median"] <= latency["lengths"]["max"]
    engines = latency["engines"]
    assert set(engines) == {"ours", "ours int8", "ctranslate2 float32", "ctranslate2 int8"}
    for row in engines.values():
        assert len(row["milliseconds"]) == 5
        assert row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= row["max_ms"] == max(row["milliseconds"])
    for precision, system in (("float32", "ours"), ("int8", "ours int8")):
        assert latency["warm_up"][system]["programs"] >= 1
        ratios = latency["ours/ctranslate2"][precision]
        peer = engines[f"ctranslate2 {precision}"]
        assert ratios["p99"] == pytest.approx(engines[system]["p99_ms"] / peer["p99_ms"])
    assert "latency: 5 sentences one at a time, beam 1" in stdout
    assert "| ctranslate2 int8 | int8 |" in stdout


def test_decoding_engines_refuse_a_latency_source_of_too_few_sentences(tmp_path, capsys):
    sentences = tmp_path / "two.en"
    sentences.write_text("A man.\n\nA dog.\n")
    stderr = run_in_process(
        capsys, "decoding_engines.py", "--converted", "tiny", "--latency", "5", "--latency-source", str(sentences),
        returncode=2,
    )
    assert f"--latency 5 needs as many sentences; --latency-source {sentences} has 2 non-empty lines" in stderr


def test_decoding_engines_switch_each_torch_path_off_in_turn(tmp_path, capsys):
    out = tmp_path / "paths.json"
    arguments = ("decoding_engines.py", "--torch-paths", "--presets", "tiny", "--batch-sizes", "2", "--source-length",
                 "3", "--output-length", "8", "--vocabulary-size", "50", "--rounds", "2", "--json", str(out))
    # Under torch in this process, which has the command line's process settings (conftest.py); else a torch command.
    if keras.backend.backend() == "torch":
        stdout = run_in_process(capsys, *arguments)
    else:
        stdout = run_benchmark(*arguments, backend="torch")
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert (run["preset"], run["batch_size"]) == ("tiny", 2)
    for search in ("greedy", "beam 4"):
        rows = run["searches"][search]
        assert list(rows) == ["all", "no direct calls", "no recorded loops", "other products", "none (Keras eager)"]
        for row in rows.values():
            assert len(row["seconds"]) == 2 and row["sentences_per_second"] > 0
            ratios = [a / b for a, b in zip(rows["all"]["seconds"], row["seconds"])]
            assert row["over_all"] == pytest.approx(sum(ratios) / 2)  # the median of two
        assert rows["all"]["over_all"] == 1.0
    assert report["products"] in ("oneDNN's", "torch's matmul") and report["products"] in stdout
    assert "tiny  batch   2 beam 4  no recorded loops" in stdout


def test_decoding_engines_refuse_the_torch_paths_under_another_backend():
    # The tool's start-up as a command under JAX, whose start-up is the quickest.
    stderr = run_benchmark("decoding_engines.py", "--torch-paths", backend="jax", returncode=2)
    assert "--torch-paths measures the torch backend's paths; KERAS_BACKEND is 'jax'" in stderr


def test_serve_load_measures_each_server_at_each_concurrency_and_the_targets(tmp_path, capsys):
    out = tmp_path / "load.json"
    train = tmp_path / "train.en"
    train.write_text("\n".join(builtin_corpus("train", size=2_000, seed=0).sources) + "\n", encoding="utf-8")
    sentences = tmp_path / "test.en"
    # Short sentences, decoded 8 tokens past their pieces: each server's answers take fewer decoding steps.
    shortest = sorted(builtin_corpus("test", size=40, seed=1).sources, key=len)[:10]
    sentences.write_text("\n".join(shortest) + "\n", encoding="utf-8")
    # The servers are commands of their own.
    run_in_process(capsys, "serve_load.py", "--size", "tiny", "--requests", "3", "--rounds", "2", "--concurrency", "1", "2",
                   "--warm-up", "1", "--no-warm-up", "--settle", "0", "--train-source", str(train),
                   "--sentences", str(sentences), "--spm-vocab", "100", "--max-extra-length", "8", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["settings"]["max_extra_length"] == 8
    assert list(report["servers"]) == ["ours", "ours-unbatched", "ctranslate2"]
    for name, server in report["servers"].items():
        assert list(server["cells"]) == ["1", "2"], (name, server)
        for row, requests in zip(server["cells"].values(), (3, 4)):  # --requests, then 2 rounds of 2 clients
            assert (row["answered"], row["failures"], row["wrong_lengths"]) == (requests, 0, 0)
            assert row["p50_ms"] <= row["p99_ms"] and row["sentences_per_second"] > 0
    assert report["servers"]["ours-unbatched"]["cells"]["2"]["sentences_per_batch"] == 1.0
    assert set(report["ratios"]) == {"ours p99/p50, c=1"}  # no cell at concurrency 32: no throughput ratio


def test_serve_load_compares_the_sentence_splitters_on_known_sentences(tmp_path):
    out = tmp_path / "splitters.json"
    for test_set, language in itertools.product(("newstest2013", "newstest2014"), ("en", "de")):
        word = "Satz" if language == "de" else "Sentence"
        (tmp_path / f"{test_set}.{language}").write_text(
            "".join(f"{word} {i} of {test_set}, Nr. {i % 7}, ends here.\n" for i in range(100)), encoding="utf-8")
    # Python's sentence splitters, no model: the tool's start-up as a command, under JAX, whose start-up is the quickest.
    run_benchmark("serve_load.py", "--splitters", "--paragraphs", "20", "--wmt", str(tmp_path), "--json", str(out),
                  backend="jax")
    rows = json.loads(out.read_text())["rows"]
    assert {(row["splitter"], row["test_set"], row["language"]) for row in rows} == {
        (splitter, test_set, language) for splitter in ("pysbd", "sentencex", "syntok")
        for test_set in ("newstest2013", "newstest2014") for language in ("en", "de")}
    for row in rows:
        assert row["paragraphs"] == 20 and 0.5 < row["precision"] <= 1 and 0.5 < row["recall"] <= 1


def test_int8_decoding_reports_speed_and_bleu_of_both(tmp_path, capsys):
    import keras_transformer as kt
    from keras_transformer.data import SubwordTokenizer
    from keras_transformer.decoding import Translator

    corpus = builtin_corpus("train", size=300, seed=0)
    tokenizer = SubwordTokenizer.train(corpus, 400)
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size)
    model_dir = tmp_path / "translator"
    Translator(model, tokenizer, max_extra_length=4).save(model_dir)
    # The quick start's layout: test.en and test.de beside the model.
    (model_dir / "test.en").write_text("\n".join(corpus.sources[:3]) + "\n")
    (model_dir / "test.de").write_text("\n".join(corpus.targets[:3]) + "\n")
    out = tmp_path / "int8.json"
    stdout = run_in_process(
        capsys, "int8_decoding.py", "--model-dir", str(model_dir), "--rounds", "1", "--json", str(out),
    )
    report = json.loads(out.read_text())
    assert report["sentences"] == 3 and report["float_dtype_policy"] == "float32"
    assert report["jit_compile"] is False
    for precision in ("float", "int8"):
        assert report[precision]["sentences_per_second"] > 0
        assert 0 <= report[precision]["bleu"] <= 100
    assert report["int8/float speed"] == pytest.approx(
        report["float"]["seconds"] / report["int8"]["seconds"]
    )
    assert "int8 / float speed" in stdout


def test_int8_decoding_refuses_a_model_dir_without_test_files(tmp_path):
    # The tool's start-up as a command, under JAX, whose start-up is the quickest.
    stderr = run_benchmark("int8_decoding.py", "--model-dir", str(tmp_path), backend="jax", returncode=2)
    assert f"{tmp_path} has no test.en and test.de: give --source and --reference" in stderr


def test_translate_scale_reports_the_peak_memory_and_speed_of_each_count(
    translation_model, translation_tokenizer, tmp_path, capsys
):
    kt.Translator(translation_model, translation_tokenizer, beam_size=1, max_extra_length=4).save(tmp_path / "model")
    (tmp_path / "corpus.en").write_text("the man sees the dog .\n\nthe cat .\na woman reads a book .\n")
    out = tmp_path / "scale.json"
    # Each count is translated by the command, in a process of its own.
    stdout = run_in_process(
        capsys, "translate_scale.py", "--model-dir", str(tmp_path / "model"), "--corpus", str(tmp_path / "corpus.en"),
        "--lines", "5", "11", "--order-lines", "7", "--batch-size", "2", "--window", "4", "--json", str(out),
    )
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["lines"], r["window"]) for r in runs] == [(5, 4), (11, 4), (7, 4), (7, 2)]
    for run in runs:
        assert run["peak_rss_mib"] > 50 and 0 < run["lines_per_second"] < run["translation_lines_per_second"]
    assert report["peak_ratio"] == pytest.approx(runs[1]["peak_rss_mib"] / runs[0]["peak_rss_mib"])
    assert report["sorted_over_file_order"] == pytest.approx(
        runs[2]["translation_lines_per_second"] / runs[3]["translation_lines_per_second"]
    )
    assert "peak at 11 lines / at 5:" in stdout


def test_translate_scale_refuses_a_corpus_without_lines(tmp_path):
    (tmp_path / "blank.en").write_text("\n  \n")
    # The tool's start-up as a command: it reads the corpus before it imports Keras.
    stderr = run_benchmark(
        "translate_scale.py", "--model-dir", str(tmp_path), "--corpus", str(tmp_path / "blank.en"), returncode=1
    )
    assert f"error: {tmp_path / 'blank.en'} has no lines to translate" in stderr
