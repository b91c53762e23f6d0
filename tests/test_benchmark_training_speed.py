"""The training-speed benchmark: one tiny step end to end, contenders of the
same size as our model, its profiles and its plot, and the trace readers it
takes from `benchmarks/_support.py`."""

import importlib.util
import json
import os
import subprocess
import sys
from unittest import mock

import keras
import pytest
from conftest import as_a_process, in_one_pass, torch_operations

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "training_speed.py")


def load_support():
    """`benchmarks/_support.py`, as a tool run from `benchmarks/` finds it."""
    if os.path.dirname(SCRIPT) not in sys.path:
        sys.path.insert(0, os.path.dirname(SCRIPT))
    import _support

    return _support


def load_benchmark():
    load_support()  # the tool imports its sibling `_support`
    spec = importlib.util.spec_from_file_location("training_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@in_one_pass("torch", "the tool's sizes, contenders, ratios and report; its runs of our model under JAX and "
             "TensorFlow are the profiled turns' (and ours_jit's) below")
def test_one_tiny_step_reports_tokens_per_second(tmp_path):
    out = tmp_path / "speed.json"
    # keras-hub's model is left out to stay within seconds: its compile would
    # double the time. test_contenders_have_our_size builds it.
    result = subprocess.run(
        [sys.executable, SCRIPT, "--size", "tiny", "--batch-size", "3", "--steps", "1",
         "--rounds", "1", "--settle", "0", "--contenders", "torch", "--out", str(out),
         # torch's profiler, its GPU kernels summed (none on a CPU)
         *(["--profile"] if keras.backend.backend() == "torch" else [])],
        env=dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    ours = report["contenders"]["ours"]
    if keras.backend.backend() == "torch":
        assert "ours, one traced turn of 1 steps:\nno GPU kernels in the trace" in result.stdout
        assert "device_trace" in ours
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


@in_one_pass("torch", "the contender's switch of our torch products")
def test_ours_other_products_take_the_library_the_rule_does_not_pick():
    from keras_transformer.backend import products

    chosen = products.onednn_preferred()
    with load_support().other_products():
        assert products.onednn_preferred() is (not chosen)
    assert products.onednn_preferred() is chosen


def benchmark_flops(shape):
    return load_benchmark().matmul_flops(**shape)


@in_one_pass("torch", "the three models' parameter counts, the same under every backend")
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


@in_one_pass("tensorflow", "the option's plumbing and TensorFlow's profiler trace; compiling costs seconds under "
             "XLA, a minute under torch.compile")
def test_ours_jit_runs_beside_ours_with_jit_compile_set_apart_and_a_profiled_turn_sums_ours_by_part(tmp_path):
    # One run for both: the profiled turn is one more turn of each contender.
    out = tmp_path / "speed.json"
    result = subprocess.run(
        [sys.executable, SCRIPT, "--size", "tiny", "--steps", "2", "--rounds", "1", "--settle", "0",
         "--contenders", "ours_jit", "--jit-compile", "false", "--profile", "--out", str(out)],
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

    parts = report["contenders"]["ours"]["tensorflow_parts"]
    assert parts["matmuls"] > 0 and parts["Adam update"] > 0
    rows = {}
    # ours' table: from its heading to the blank line after it.
    table = result.stdout.split("\nours, one traced turn of 2 steps:\n", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1].replace(".", "").isdigit():
            rows[cells[0]] = float(cells[1])
    assert rows["matmuls"] == pytest.approx(parts["matmuls"], abs=1e-4)
    assert rows["all"] == pytest.approx(sum(parts.values()), abs=1e-4 * len(parts))


@in_one_pass("jax", "the corpus's batching and the report's arithmetic, the same under every backend; XLA's "
             "optimized modules, which only JAX's step is here (TensorFlow's parts are tested above)")
def test_a_corpus_makes_bucketed_batches_whose_padding_the_report_leaves_out_and_a_profiled_jax_turn_times_each_part(
    tmp_path, capsys
):
    """`--corpus`: batches of a real corpus's lengths, as `train` buckets
    them; target tokens are the real ones, and the FLOPs without padding
    are fewer than those the device computes. Under JAX the same run,
    profiled in mixed_bfloat16, sums XLA's operations by part of the model."""
    from keras_transformer.data import builtin_corpus

    corpus = builtin_corpus("valid", size=400)
    source, target = tmp_path / "pairs.en", tmp_path / "pairs.de"
    source.write_text("".join(line + "\n" for line in corpus.sources), encoding="utf-8")
    target.write_text("".join(line + "\n" for line in corpus.targets), encoding="utf-8")
    out = tmp_path / "speed.json"
    profiled = keras.backend.backend() == "jax"
    result = subprocess.run(
        [sys.executable, SCRIPT, "--size", "tiny", "--corpus", str(source), str(target),
         "--corpus-vocabulary", "500", "--tokens-per-batch", "512", "--buckets", "2", "--steps", "2", "--rounds", "1", "--settle", "0",
         "--contenders", "--out", str(out), *(["--precision", "mixed_bfloat16", "--profile"] if profiled else [])],
        env=dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "the lengths of pairs.de" in report["data"]
    assert 1 <= len({shape[2] for shape in report["batch_shapes"]}) <= 2  # at most 2 lengths
    assert 0 < report["padding"] < 1
    assert report["target_tokens_per_step"] < max(rows * length for rows, _, length in report["batch_shapes"])
    ours = report["contenders"]["ours"]
    assert 0 < ours["mfu_without_padding"] < ours["mfu"]
    bad = run_main(capsys, "--corpus", str(source), str(tmp_path / "missing.de"))
    assert bad.returncode == 2 and "--corpus: no such file" in bad.stderr

    if profiled:
        parts = ours["xla_parts"]
        assert "XLA's operations by part of the model (thread-seconds on the CPU; 100% of their time" in result.stdout
        for part in ("dropout", "layer norm", "Adam update", "attention projections", "feed-forward"):
            assert parts[part]["forward"] + parts[part]["backward"] > 0, part
        # Products in the backward pass (each layer's two gradients), none in Adam's.
        assert parts["feed-forward"]["backward"] > 0 and parts["feed-forward"]["matmul"] > 0
        assert parts["Adam update"]["matmul"] == 0


def test_the_device_trace_sorts_kernels_by_kind_and_splits_idle_time():
    support = load_support()
    assert support.kind_of("nvjet_sm90_tst_256x128") == "matmul"
    assert support.kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_bprop") == "fused attention (cuDNN)"
    assert support.kind_of("input_scatter_fusion") == "scatter (embedding gradients)"
    assert support.kind_of("loop_add_fusion_11") == "other XLA fusions"
    # Two kernels overlap, then a 2 us gap, then a 1 ms one (a wait on the host).
    spans = [(0, 10, "a"), (5, 20, "b"), (22, 40, "c"), (1_000_040, 1_000_050, "d")]
    idle = support.idle_gaps(spans, long_ns=500_000)
    assert idle["seconds"] == pytest.approx((2 + 1_000_000) / 1e9)
    assert idle["long_gaps"] == 1 and idle["long_seconds"] == pytest.approx(1e-3)
    assert idle["around"] == [("c -> d", pytest.approx(1e-3))]


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="counts the operations a torch step launches")
def test_a_torch_step_of_ours_launches_fewer_operations_than_torch_nn_transformer():
    """Under torch a GPU step waits on the host, which launches one
    operation at a time: ours at the small size must launch no more than
    `torch.nn.Transformer`'s eager step with torch's Adam (1,911 against
    2,579 when written), so that what separates the two is the host time
    per operation, not their number."""
    benchmark = load_benchmark()
    size = dict(benchmark.SIZES["small"], batch_size=4)
    batches = benchmark.random_data(size, 1)
    model = benchmark.our_model(size)
    benchmark.compile_model(model, warmup_steps=benchmark.WARMUP_STEPS, label_smoothing=benchmark.LABEL_SMOOTHING)
    theirs = benchmark.TorchContender(size, "float32", batches)
    model.train_on_batch(*batches[0])  # builds the optimizer
    theirs.train(1)
    with torch_operations() as ours_count:
        model.train_on_batch(*batches[0])
    with torch_operations() as theirs_count:
        theirs.train(1)
    counts = len(ours_count.operations), len(theirs_count.operations)
    assert 0 < counts[0] <= counts[1], counts


# An optimized module as XLA writes it, cut down: a product fused on its
# own, a layer norm, the loss's gradient fused into the logits' cast (whose
# own name stack is the model's), and a copy that names nothing.
OPTIMIZED_MODULE = """\
HloModule jit_train_step, entry_computation_layout={(f32[4,8]{1,0})->f32[4,8]{1,0}}

%fused_computation.1 (param_0.1: bf16[4,8], param_1.1: bf16[8,8]) -> bf16[4,8] {
  %param_0.1 = bf16[4,8]{1,0} parameter(0)
  %param_1.1 = bf16[8,8]{1,0} parameter(1)
  ROOT %dot.1 = bf16[4,8]{1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp(decoder_block_0)/cross_attention/query/dot_general"}
}

%fused_computation.2 (param_0.2: f32[4,8]) -> bf16[4,8] {
  %param_0.2 = f32[4,8]{1,0} parameter(0)
  %exponential.2 = f32[4,8]{1,0} exponential(%param_0.2), metadata={op_name="jit(train_step)/transpose(jvp(compile_loss))/label_smoothed_cross_entropy/exp"}
  %multiply.2 = f32[4,8]{1,0} multiply(%exponential.2, %exponential.2), metadata={op_name="jit(train_step)/transpose(jvp(compile_loss))/label_smoothed_cross_entropy/mul"}
  ROOT %convert.2 = bf16[4,8]{1,0} convert(%multiply.2), metadata={op_name="jit(train_step)/transpose(jvp())/convert_element_type"}
}

ENTRY %main.9 (Arg_0.1: f32[4,8]) -> f32[4,8] {
  %Arg_0.1 = f32[4,8]{1,0} parameter(0)
  %query_fusion = bf16[4,8]{1,0} fusion(%Arg_0.1, %Arg_0.1), kind=kOutput, calls=%fused_computation.1, metadata={op_name="jit(train_step)/jvp(decoder_block_0)/cross_attention/query/dot_general"}
  %norm_fusion = f32[4,8]{1,0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(train_step)/transpose(jvp(encoder_block_1))/feed_forward_norm/reduce_sum"}
  %multiply_convert_fusion = bf16[4,8]{1,0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(train_step)/transpose(jvp())/convert_element_type"}
  ROOT %copy.7 = f32[4,8]{1,0} copy(%Arg_0.1)
}
"""


def test_xla_s_operations_are_summed_by_the_part_of_the_model_they_came_from(tmp_path):
    support = load_support()
    (tmp_path / "module_0042.jit_train_step.sm_9.0_gpu_after_optimizations.txt").write_text(OPTIMIZED_MODULE)
    modules = support.xla_operations(str(tmp_path))
    assert set(modules) == {42}
    found = modules[42]
    assert found["query_fusion"][1:] == (True, False)  # a product, forward
    assert found["multiply_convert_fusion"][1:] == (False, True)  # backward
    times = {"query_fusion": 0.004, "norm_fusion": 0.002, "multiply_convert_fusion": 0.003, "copy.7": 0.001,
             "fusion.from_another_module": 0.005}
    parts = support.by_part(times, found)
    assert parts["attention projections"] == {"forward": 0.004, "backward": 0.0, "matmul": 0.004}
    assert parts["layer norm"] == {"forward": 0.0, "backward": 0.002, "matmul": 0.0}
    assert parts["loss and metrics"] == {"forward": 0.0, "backward": 0.003, "matmul": 0.0}
    assert parts[support.OTHER_PART]["forward"] == pytest.approx(0.006)
    assert list(parts)[0] == support.OTHER_PART  # the most time first
    assert "| attention projections | 2.00 | 0.00 | 2.00 | 27% |" in support.parts_markdown(parts, steps=2)
    # The module a trace ran: the one it names, else the one naming most of its time.
    assert support.module_of(times, {7: {}, 42: found}, programs=[7]) == {}
    assert support.module_of(times, {7: {}, 42: found}) is found


@in_one_pass("torch", "reads JSON reports and draws a PNG, the same under every backend")
def test_the_plot_draws_each_ratio_found(tmp_path, capsys):
    (tmp_path / "bucketing_tensorflow.json").write_text(json.dumps({"bucketed/padded": 1.7}))
    (tmp_path / "precision_jax.json").write_text(json.dumps({"mixed_bfloat16/float32": 0.8}))
    (tmp_path / "cpu_torch_small_float32.json").write_text(json.dumps({"ratios": {"ours/keras_hub": 1.25}}))
    out = tmp_path / "ratios.png"
    result = run_plot(capsys, "--results", str(tmp_path), "--out", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = result.stdout.splitlines()
    drawn = [line for line in lines if ": reading " not in line and not line.startswith("wrote")]
    # In display order: training, then precision, then batching.
    assert drawn == [
        "ours / keras-hub, small fp32, torch: 1.25 (target 1.0)",
        "mixed_bfloat16 / float32, Multi30k, jax: 0.80 (target 1.5)",
        "bucketed / padded batches, Multi30k, tensorflow: 1.70 (target 1.3)",
    ]


@in_one_pass("torch", "reads JSON reports and draws a PNG, the same under every backend")
def test_the_plot_prefers_the_named_runs(tmp_path, capsys):
    (tmp_path / "precision_jax.json").write_text(json.dumps({"mixed_bfloat16/float32": 0.8}))
    (tmp_path / "precision_jax_new.json").write_text(json.dumps({"mixed_bfloat16/float32": 1.1}))
    (tmp_path / "precision_tensorflow.json").write_text(json.dumps({"mixed_bfloat16/float32": 1.2}))
    out = tmp_path / "ratios.png"
    result = run_plot(capsys, "--results", str(tmp_path), "--out", str(out), "--prefer", "new")
    assert "mixed_bfloat16 / float32, Multi30k, jax: 1.10 (target 1.5)" in result.stdout
    assert "precision_jax.json: reading precision_jax_new.json" in result.stdout
    # Without a preferred run, the plain report is read.
    assert "mixed_bfloat16 / float32, Multi30k, tensorflow: 1.20 (target 1.5)" in result.stdout
    # And a folder without reports is an error, not an empty picture.
    (tmp_path / "empty").mkdir()
    empty = run_plot(capsys, "--results", str(tmp_path / "empty"), "--out", str(tmp_path / "empty.png"), check=False)
    assert empty.returncode == 2 and "no benchmark results in" in empty.stderr
    assert not (tmp_path / "empty.png").exists()


def run_plot(capsys, *arguments, check=True):
    result = run_main(capsys, "--plot", *arguments)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_main(capsys, *arguments):
    """`training_speed.py ARGUMENTS`, its `main` run in this process, for
    runs that train nothing: the tool's start-up as a command is tested
    above, and a process of its own would import the package again."""
    benchmark = load_benchmark()
    with mock.patch.object(sys, "argv", [SCRIPT, *arguments]):
        return as_a_process(capsys, benchmark.main)
