"""Smoke tests of the training benchmarks: each script runs one step end to end
on a corpus small enough for seconds, and reports what it promises. The
timings themselves are never asserted: the machines are shared and noisy."""

import json
import os
import subprocess
import sys

import keras
import pytest
from conftest import in_one_pass

import keras_transformer as kt
from keras_transformer.data import builtin_corpus

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")

# The scripts' own code is the same under every backend; the model code they
# drive is tested in every pass.
pytestmark = in_one_pass("torch", "benchmark scripts' smoke runs")


@pytest.fixture(scope="module")
def parallel_files(tmp_path_factory):
    """train.en / train.de in a folder, as Multi30k's, from the built-in corpus."""
    folder = tmp_path_factory.mktemp("corpus")
    corpus = builtin_corpus("train", size=600)
    (folder / "train.en").write_text("\n".join(corpus.sources) + "\n")
    (folder / "train.de").write_text("\n".join(corpus.targets) + "\n")
    return folder


def run_benchmark(script, *arguments):
    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, script), *arguments],
        env=dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_bucketing_reports_padding_and_tokens_per_second(parallel_files, tmp_path):
    out = tmp_path / "bucketing.json"
    stdout = run_benchmark(
        "bucketing.py", "--data-dir", str(parallel_files), "--vocabulary-size", "500",
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
    assert "bucketed / padded" in stdout


def test_precision_speed_runs_both_precisions(parallel_files):
    stdout = run_benchmark(
        "precision.py", "--data-dir", str(parallel_files), "--vocabulary-size", "500",
        "--tokens-per-batch", "512", "--steps", "1", "--rounds", "1",
    )
    assert "mixed_bfloat16 speedup over float32" in stdout
    assert f"{keras.backend.backend()} float32:" in stdout


def test_precision_loss_compares_curves_with_the_seed_spread(tmp_path):
    out = tmp_path / "curves.json"
    stdout = run_benchmark(
        "precision_loss.py", "--steps", "2", "--window", "1", "--seeds", "2",
        "--train-size", "600", "--json", str(out),
    )
    report = json.loads(out.read_text())
    for precision in ("float32", "mixed_bfloat16"):
        assert [len(curve) for curve in report["curves"][precision]] == [2, 2]
    float32 = report["curves"]["float32"]
    # The spread is that of the float32 seeds, window by window.
    assert report["spread"] == pytest.approx(
        [max(a, b) - min(a, b) for a, b in zip(*float32)]
    )
    assert "gap / spread" in stdout


def test_plot_ratios_draws_each_ratio_found(tmp_path):
    (tmp_path / "bucketing_tensorflow.json").write_text(json.dumps({"bucketed/padded": 1.7}))
    (tmp_path / "precision_jax.json").write_text(json.dumps({"mixed_bfloat16/float32": 0.8}))
    out = tmp_path / "ratios.png"
    stdout = run_benchmark("plot_ratios.py", "--results", str(tmp_path), "--out", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bucketed / padded batches, Multi30k, tensorflow: 1.70 (target 1.3)" in stdout
    assert "mixed_bfloat16 / float32, Multi30k, jax: 0.80 (target 1.5)" in stdout


def test_plot_ratios_prefers_the_named_runs(tmp_path):
    (tmp_path / "precision_jax.json").write_text(json.dumps({"mixed_bfloat16/float32": 0.8}))
    (tmp_path / "precision_jax_new.json").write_text(json.dumps({"mixed_bfloat16/float32": 1.1}))
    (tmp_path / "precision_tensorflow.json").write_text(json.dumps({"mixed_bfloat16/float32": 1.2}))
    out = tmp_path / "ratios.png"
    stdout = run_benchmark(
        "plot_ratios.py", "--results", str(tmp_path), "--out", str(out), "--prefer", "new"
    )
    assert "mixed_bfloat16 / float32, Multi30k, jax: 1.10 (target 1.5)" in stdout
    assert "precision_jax.json: reading precision_jax_new.json" in stdout
    # Without a preferred run, the plain report is read.
    assert "mixed_bfloat16 / float32, Multi30k, tensorflow: 1.20 (target 1.5)" in stdout


def test_matmul_peak_reports_both_dtypes(tmp_path):
    out = tmp_path / "peak.json"
    stdout = run_benchmark("matmul_peak.py", "--sizes", "64", "--seconds", "0.05", "--json", str(out))
    rates = json.loads(out.read_text())["flops_per_second"]["64"]
    assert rates["float32"] > 0 and rates["bfloat16"] > 0
    assert f"| 64 | {rates['float32'] / 1e9:,.0f} |" in stdout


def test_int8_decoding_reports_speed_and_bleu_of_both(tmp_path):
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
    stdout = run_benchmark(
        "int8_decoding.py", "--model-dir", str(model_dir), "--rounds", "1", "--json", str(out),
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


def test_decoding_engines_time_every_contender_on_the_same_steps(tmp_path):
    out = tmp_path / "engines.json"
    stdout = run_benchmark(
        "decoding_engines.py", "--presets", "tiny", "--batch-sizes", "2", "--source-length", "3",
        "--output-length", "6", "--vocabulary-size", "300", "--rounds", "1", "--settle", "0",
        "--json", str(out),
    )
    (run,) = json.loads(out.read_text())["runs"]
    rows = run["contenders"]
    # Each system decoded exactly 6 tokens per sentence, or the script
    # would have stopped: greedy and beam 4, float32 and int8.
    expected = {
        "ours", "ours, beam 4", "ours int8", "ours int8, beam 4",
        "keras-hub GreedySampler", "keras-hub BeamSampler",
        "transformers generate", "transformers generate, beam 4",
        "ctranslate2 float32", "ctranslate2 float32, beam 4",
        "ctranslate2 int8", "ctranslate2 int8, beam 4",
    }
    assert set(rows) == expected
    # Every peer is set against ours with the same search and precision.
    for name, row in rows.items():
        if name.startswith("ours"):
            continue
        mine = "ours" + (" int8" if row["precision"] == "int8" else "")
        mine += ", beam 4" if row["search"] == "beam 4" else ""
        assert row["ours/this"] == pytest.approx(
            rows[mine]["sentences_per_second"] / row["sentences_per_second"]
        )
    assert "| ctranslate2 int8, beam 4 | beam 4 | int8 |" in stdout


def test_torch_cpu_products_compare_both_at_each_shape(tmp_path):
    out = tmp_path / "products.json"
    stdout = run_benchmark(
        "torch_cpu_products.py", "--sizes", "small", "--decoding-rows", "4",
        "--seconds", "0.01", "--rounds", "1", "--json", str(out),
    )
    report = json.loads(out.read_text())
    # 4 products of the small model, each forward and with both gradients
    # in training, and forward at 4 rows in decoding.
    assert len(report["results"]) == 4 * 4
    assert {r["use"] for r in report["results"]} == {"forward", "input gradient", "kernel gradient", "decoding"}
    for r in report["results"]:
        rates = r["flops_per_second"]
        assert rates["matmul"] > 0 and rates["onednn"] > 0
        assert r["matmul/onednn"] == pytest.approx(rates["matmul"] / rates["onednn"])
    assert "| small | decoding | 4 x 256 x 8000 |" in stdout
    assert f"the package multiplies with {report['package_uses']} here" in stdout


def test_torch_paths_decode_with_each_path_switched_off_in_turn(tmp_path):
    out = tmp_path / "paths.json"
    stdout = run_benchmark(
        "torch_paths.py", "--presets", "tiny", "--batch-size", "2", "--source-length", "3",
        "--output-length", "8", "--vocabulary-size", "50", "--rounds", "2", "--json", str(out),
    )
    report = json.loads(out.read_text())
    for search in ("greedy", "beam 4"):
        rows = report["presets"]["tiny"][search]
        assert list(rows) == ["all", "no direct calls", "no recorded loops", "other products", "none (Keras eager)"]
        for row in rows.values():
            assert len(row["seconds"]) == 2 and row["sentences_per_second"] > 0
            ratios = [a / b for a, b in zip(rows["all"]["seconds"], row["seconds"])]
            assert row["over_all"] == pytest.approx(sum(ratios) / 2)
        assert rows["all"]["over_all"] == 1.0
    assert report["products"] in ("oneDNN's", "torch's matmul") and report["products"] in stdout
    assert "tiny  beam 4  no recorded loops" in stdout


def test_translate_scale_reports_the_peak_memory_and_speed_of_each_count(
    translation_model, translation_tokenizer, tmp_path
):
    kt.Translator(translation_model, translation_tokenizer, beam_size=1, max_extra_length=4).save(tmp_path / "model")
    (tmp_path / "corpus.en").write_text("the man sees the dog .\n\nthe cat .\na woman reads a book .\n")
    out = tmp_path / "scale.json"
    stdout = run_benchmark(
        "translate_scale.py", "--model-dir", str(tmp_path / "model"), "--corpus", str(tmp_path / "corpus.en"),
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


def test_gpu_decoding_times_ours_and_transformers_on_the_same_steps(tmp_path):
    """The GPU script's smoke run, on the CPU where there is no GPU."""
    out = tmp_path / "gpu.json"
    stdout = run_benchmark(
        "gpu_decoding.py", "--preset", "tiny", "--batch-sizes", "2", "--output-length", "24",
        "--rounds", "1", "--json", str(out),
    )
    rows = json.loads(out.read_text())
    assert [(row["batch_size"], row["beam_size"]) for row in rows] == [(2, 1), (2, 4)]
    assert all(row["ours_seconds"] > 0 and row["transformers_seconds"] > 0 for row in rows)
    assert "ours / transformers" in stdout


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the script times Keras's torch backend against eager torch, and exits with an error under the others")
def test_torch_host_time_times_both_steps_and_counts_their_operations_and_calls(tmp_path):
    out = tmp_path / "host.json"
    stdout = run_benchmark("torch_host_time.py", "--steps", "2", "--rounds", "2", "--json", str(out))
    report = json.loads(out.read_text())
    ms, operations = report["ms_per_step"], report["operations_per_step"]
    assert ms["ours"] > 0 and ms["torch"] > 0
    assert report["ours_speed_over_torch"] == pytest.approx(ms["torch"] / ms["ours"])
    # A step of each launches thousands of operations at the base's 12
    # layers, and makes thousands of Python calls.
    assert operations["ours"] > 1000 and operations["torch"] > 1000
    # Of which those that compute, a kernel each on a GPU: not the views.
    computing = report["computing_operations_per_step"]
    assert all(500 < computing[name] < operations[name] for name in operations)
    calls = report["function_calls_per_step"]
    assert calls["ours"] > 1000 and calls["torch"] > 1000
    assert "ours / torch.nn.Transformer, speed:" in stdout


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the script counts Keras's torch backend's decoding steps against transformers', and exits with an error under the others")
def test_torch_decoding_host_counts_a_step_of_ours_and_of_transformers(tmp_path):
    out = tmp_path / "decoding_host.json"
    stdout = run_benchmark(
        "torch_decoding_host.py", "--batch-sizes", "2", "--source-length", "4", "--output-length", "17",
        "--steps", "2", "--rounds", "1", "--num-layers", "2", "--json", str(out),
    )  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(row["batch_size"], row["beam_size"]) for row in rows] == [(2, 1), (2, 4)]
    for row in rows:
        for name in ("ours", "transformers"):
            figures = row[name]
            # 2 decoder blocks: dozens of kernels a step, and views.
            assert 30 < figures["computing_operations"] < figures["operations"]
        # Ours replays a record of the step, a Python call or two per
        # operation; transformers' `generate` runs its modules from Python.
        assert row["ours"]["function_calls"] < 1000 < row["transformers"]["function_calls"]
        assert row["ours_speed_over_transformers"] == pytest.approx(
            row["transformers"]["ms_per_step"] / row["ours"]["ms_per_step"]
        )
    assert "ours / transformers, speed:" in stdout


def test_heap_times_both_malloc_settings_in_fresh_processes(tmp_path):
    out = tmp_path / "heap.json"
    stdout = run_benchmark(
        "heap.py", "--backends", "jax", "--size", "tiny", "--steps", "1", "--rounds", "1", "--out", str(out),
    )
    report = json.loads(out.read_text())["backends"]["jax"]
    heap, default = report["heap"], report["glibc default"]
    for result in (heap, default):
        assert result["target_tokens_per_second"] > 0 and result["minor_page_faults"] > 0
    assert report["heap_over_default"] == pytest.approx(
        heap["target_tokens_per_second"] / default["target_tokens_per_second"]
    )
    assert "| jax | glibc default |" in stdout and "heap / default" in stdout


def test_compile_time_reports_each_setting_and_length_from_its_own_process(parallel_files, tmp_path):
    out = tmp_path / "compile.json"
    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "compile_time.py"), "--size", "tiny",
         "--corpus", str(parallel_files / "train.en"), str(parallel_files / "train.de"),
         "--corpus-vocabulary", "500", "--tokens-per-batch", "256", "--buckets", "2", "--sample", "20", "--steps", "8", "--rounds", "1",
         "--settings", "no Triton GEMMs", "--out", str(out)],  # one: each is a process of its own
        env=dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    settings = json.loads(out.read_text())["settings"]
    assert settings["no Triton GEMMs"]["xla_flags"].endswith("--xla_gpu_enable_triton_gemm=false")
    for setting in settings.values():
        lengths = [row["batch"][1] for row in setting["lengths"]]
        assert len(lengths) == 2 and lengths == sorted(lengths)  # both buckets, shortest first
        assert all(row["first_fit_seconds"] > row["step_seconds"] > 0 for row in setting["lengths"])
    assert "first fits" in result.stdout and "x its speed" in result.stdout


def test_batch_shapes_times_plain_and_aligned_rows_of_each_length(tmp_path):
    out = tmp_path / "shapes.json"
    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "batch_shapes.py"), "--size", "tiny", "--lengths", "22",
         "--tokens-per-batch", "2000", "--steps", "8", "--rounds", "1", "--dropout", "0", "--out", str(out)],
        env=dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["lengths"]
    assert [row["length"] for row in rows] == [22] and report["dropout"] == 0
    for row in rows:
        plain, aligned = row["plain"], row["aligned"]
        assert plain["rows"] == 2000 // row["length"] and aligned["rows"] < plain["rows"]
        assert aligned["tokens"] % 8 == 0 and plain["tokens"] % 8
        assert all(side["first_fit_seconds"] > side["step_seconds"] > 0 for side in (plain, aligned))
    assert "aligned / plain" in result.stdout


def test_converted_engines_time_ours_against_generate_and_ctranslate2_on_the_same_weights(tmp_path):
    out = tmp_path / "converted.json"
    stdout = run_benchmark(
        "converted_engines.py", "--size", "tiny", "--batch-sizes", "2", "--source-length", "3",
        "--output-length", "8", "--rounds", "1", "--settle", "0", "--json", str(out),
    )
    cells = json.loads(out.read_text())["cells"]["batch 2"]
    peers = {"transformers generate", "ctranslate2 float32", "ctranslate2 int8"}
    for search in ("", ", beam 4"):
        for name in {"ours"} | peers:
            row = cells[name + search]
            assert row["sentences_per_second"] > 0
            ours = cells["ours" + search]["sentences_per_second"]
            assert row["ours/this"] == pytest.approx(ours / row["sentences_per_second"])
    assert "tiny's size, converted, batch 2" in stdout
