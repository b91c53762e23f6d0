"""The training-speed benchmark: one tiny step end to end, and contenders of
the same size as our model."""

import importlib.util
import json
import os
import subprocess
import sys

import keras
import pytest
from conftest import in_one_pass

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "training_speed.py")


def load_benchmark():
    # The script imports its sibling `fit_timing`, as a script run from
    # `benchmarks/` would find it.
    if os.path.dirname(SCRIPT) not in sys.path:
        sys.path.insert(0, os.path.dirname(SCRIPT))
    spec = importlib.util.spec_from_file_location("training_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_tiny_step_reports_tokens_per_second(tmp_path):
    out = tmp_path / "speed.json"
    # keras-hub's model is left out to stay within seconds: its compile would
    # double the time. The next test builds it.
    result = subprocess.run(
        [sys.executable, SCRIPT, "--size", "tiny", "--batch-size", "3", "--steps", "1",
         "--rounds", "1", "--contenders", "torch", "--out", str(out)],
        env=dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    ours = report["contenders"]["ours"]
    assert report["keras_backend"] == keras.backend.backend()
    assert report["shape"]["batch_size"] == 3  # --batch-size replaces the size's 2
    assert report["matmul_flops_per_step"] == benchmark_flops(report["shape"])
    assert ours["target_tokens_per_second"] > 0
    assert ours["mfu"] > 0
    if "torch" in report["contenders"]:
        assert report["ratios"]["ours/torch"] > 0
    else:
        assert report["skipped"]["torch"]
    assert "| ours" in result.stdout


@in_one_pass("tensorflow", "the option's plumbing; compiling costs seconds under XLA, a minute under torch.compile")
def test_ours_jit_runs_beside_ours_with_jit_compile_set_apart(tmp_path):
    out = tmp_path / "speed.json"
    result = subprocess.run(
        [sys.executable, SCRIPT, "--size", "tiny", "--steps", "1", "--rounds", "1", "--settle", "0",
         "--contenders", "ours_jit", "--jit-compile", "false", "--out", str(out)],
        env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["jit_compile"] is False
    assert set(report["contenders"]) == {"ours", "ours_jit"}
    assert report["contenders"]["ours"]["jit_compile"] is False
    assert report["contenders"]["ours_jit"]["jit_compile"] is True
    assert report["ratios"]["ours/ours_jit"] > 0
    assert "jit_compile=False" in result.stdout and "| ours_jit" in result.stdout


def benchmark_flops(shape):
    return load_benchmark().matmul_flops(**shape)


def test_contenders_have_our_size():
    pytest.importorskip("keras_hub")
    benchmark = load_benchmark()
    size = benchmark.SIZES["tiny"]
    architecture = {key: size[key] for key in ("vocabulary_size", "num_layers", "d_model", "num_heads")}
    ours = benchmark.build_transformer("base", **architecture, d_ff=4 * size["d_model"])
    keras_hub_model = benchmark.keras_hub_transformer(**architecture, dtype=None)
    assert keras_hub_model.count_params() == ours.count_params()
    if importlib.util.find_spec("torch") is not None:
        torch_model = benchmark._torch_transformer(size)
        # torch.nn.Transformer ends each stack with a LayerNorm, which a
        # post-LN stack does not need: 2 x (gamma, beta) of d_model each.
        extra = 4 * size["d_model"]
        assert sum(p.numel() for p in torch_model.parameters()) == ours.count_params() + extra


@in_one_pass("tensorflow", "reads TensorFlow's profiler trace")
def test_profile_step_sums_the_traced_operations_by_part():
    script = os.path.join(os.path.dirname(SCRIPT), "profile_step.py")
    result = subprocess.run(
        [sys.executable, script, "--size", "tiny", "--steps", "2", "--rounds", "1", "--profile"],
        env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1].replace(".", "").isdigit():
            rows[cells[0]] = float(cells[1])
    assert rows["matmuls"] > 0 and rows["Adam update"] > 0
    parts = sum(value for part, value in rows.items() if part != "all")
    assert rows["all"] == pytest.approx(parts, abs=0.01 * len(rows))
