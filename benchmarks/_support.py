"""What the benchmark tools share; not a tool of its own.

- timing `fit`'s steps and feeding it ready-made batches (`step_times`,
  `fit_batches`, `one_batch_per_shape`);
- the matmul rate of a Keras backend (`matmul_rate`), and our torch products
  through the library the package's rule does not pick (`other_products`);
- reading traces: the GPU's kernel time by kind and its idle gaps (JAX's and
  torch's profilers), XLA's operations summed by the part of the model
  they came from, TensorFlow's operations by part on the CPU;
- CTranslate2 in a process of its own, for `decoding_engines.py`: the
  worker (`python benchmarks/_support.py ctranslate2-worker`) and its client;
- a CTranslate2 HTTP server of the kind users build, for `serve_load.py`
  (`python benchmarks/_support.py ctranslate2-server ...`);
- the training ratios as one PNG (`training_speed.py --plot`).

The tools import it as a sibling module (`python benchmarks/<tool>.py` puts
this folder first on `sys.path`). Keras, torch and the rest are imported in
the functions that use them, so that the CTranslate2 worker starts without
them.
"""

import collections
import contextlib
import glob
import json
import os
import pickle
import re
import sys
import time

# === Timing `fit` ===


def step_times():
    """A callback of `perf_counter` times inside one `fit`: `begin` (training
    began), `first` (its first step began) and `ends` (each step ended, once
    its logs were on the host; in order).

    Under JAX and torch, Keras runs its step hook on a thread of its own
    (`async_safe`), as it runs the `train` command's: the steps do not wait
    for their logs, as a plain `fit`'s or an eager torch loop's do not (a
    hook on the main thread would make each step wait for the device)."""
    import keras

    class StepTimes(keras.callbacks.Callback):
        async_safe = True

        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()
            self.ends = []

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                self.first = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())  # list.append holds the GIL

        def on_train_end(self, logs=None):
            # Keras has waited for its threads; they may have ended out of order.
            self.ends.sort()

    return StepTimes()


def one_batch_per_shape(batches):
    """The first batch of each (source, labels) shape: a warm-up that
    compiles every shape."""
    shapes = {}
    for inputs, labels in batches:
        shapes.setdefault((tuple(inputs["source_ids"].shape), tuple(labels.shape)), (inputs, labels))
    return list(shapes.values())


def fit_batches(model, batches, callbacks=()):
    """One `fit` epoch over `batches` of `({"source_ids", "target_ids"}, labels)`.

    They go through a `tf.data` dataset that declares every length variable:
    Keras infers a Python generator's shapes from its first batches, and
    would fix the length.
    """
    import tensorflow as tf

    ids = tf.TensorSpec([None, None], tf.int32)
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(batches), output_signature=({"source_ids": ids, "target_ids": ids}, ids)
    )
    model.fit(dataset, steps_per_epoch=len(batches), epochs=1, verbose=0, callbacks=list(callbacks))


# === Matmul rates and products ===


def matmul_rate(size, dtype, seconds):
    """FLOP/s of `keras.ops.matmul` of two `size` x `size` matrices, repeated
    for about `seconds` after one untimed call (which compiles, under JAX)."""
    import keras

    def wait_for(product):
        # As float32: NumPy cannot take a bfloat16 scalar from TensorFlow.
        keras.ops.convert_to_numpy(keras.ops.cast(product[0, 0], "float32"))

    a = keras.random.normal((size, size), dtype=dtype, seed=0)
    b = keras.random.normal((size, size), dtype=dtype, seed=1)
    wait_for(keras.ops.matmul(a, b))
    products = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        product = keras.ops.matmul(a, b)
        products += 1
    wait_for(product)
    return 2 * size**3 * products / (time.perf_counter() - start)


@contextlib.contextmanager
def other_products():
    """While inside, our float32 torch products go through the library the
    package's rule (`backend.products.onednn_preferred`) does not pick on
    this CPU: what the rule buys, in training and in decoding."""
    from keras_transformer.backend import products

    preferred = products.onednn_preferred
    flipped = not preferred()
    products.onednn_preferred = lambda: flipped
    try:
        yield
    finally:
        products.onednn_preferred = preferred


# === The GPU's kernels in a JAX or torch trace ===

KERNEL_KINDS = [
    # (kind, words in a kernel's name, lower case), the first that matches.
    ("fused attention (cuDNN)", ("cudnn", "fmha", "flash", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "dot")),
    ("scatter (embedding gradients)", ("scatter",)),
    ("copy or transfer", ("memcpy", "memset", "copy")),
]


def kind_of(kernel):
    lower = kernel.lower()
    return next((kind for kind, words in KERNEL_KINDS if any(word in lower for word in words)), "other XLA fusions")


@contextlib.contextmanager
def jax_traced(directory):
    import jax

    with jax.profiler.trace(directory):
        yield


def _newest_planes(directory):
    """The planes of the newest JAX trace under `directory` (none if none)."""
    from jax.profiler import ProfileData

    paths = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    return list(ProfileData.from_file(paths[-1]).planes) if paths else []


def jax_kernel_time(directory):
    """`{"seconds", "idle", "kernels", "by_kind", "top"}` of the GPU kernels
    in the newest JAX trace under `directory` (read with
    `jax.profiler.ProfileData`: no TensorFlow), or None where it holds no
    GPU plane."""
    planes = _newest_planes(directory)
    gpu = [plane for plane in planes if plane.name.startswith("/device:GPU")]
    if not gpu:
        return None
    by_name = collections.defaultdict(lambda: [0.0, 0])
    spans = []  # (start, end, name) of every kernel, in ns
    lines = set()
    for plane in gpu:
        for line in plane.lines:
            lines.add(line.name)
            # Kernels sit on the stream lines; "XLA Ops" and "XLA Modules"
            # restate the same time per operation and per program.
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                by_name[event.name][0] += event.duration_ns / 1e9
                by_name[event.name][1] += 1
                spans.append((event.start_ns, event.end_ns, event.name))
    if not by_name:
        raise ValueError(f"The trace's GPU planes hold no stream lines; its lines: {sorted(lines)}")
    host_lines = [line for plane in planes if plane.name.startswith("/host:") for line in plane.lines]
    return _kernel_summary(by_name, spans, host_lines)


def jax_operation_time(directory, module="train_step"):
    """`({operation: seconds}, programs)` per XLA operation (as named in the
    optimized module, `xla_operations`) in the newest trace under
    `directory`, and the modules' numbers where the trace gives them: on a
    GPU, its "XLA Ops" line (or its kernels' `hlo_op`); else XLA:CPU's,
    whose operations run on the host's threads. Only `module`'s operations
    where the trace names each operation's module."""
    planes = _newest_planes(directory)
    gpu = [plane for plane in planes if plane.name.startswith("/device:GPU")]
    ops_lines = [line for plane in gpu for line in plane.lines if line.name == "XLA Ops"]
    if gpu and not ops_lines:
        ops_lines = [line for plane in gpu for line in plane.lines if line.name.startswith("Stream")]
    if not gpu:
        ops_lines = [line for plane in planes if plane.name.startswith("/host:") for line in plane.lines]
    times, programs = collections.Counter(), collections.Counter()
    for line in ops_lines:
        for event in line.events:
            stats = dict(event.stats)
            operation = stats.get("hlo_op") or (event.name if line.name == "XLA Ops" else None)
            if operation and module in str(stats.get("hlo_module", module)):
                times[operation] += event.duration_ns / 1e9
                if "program_id" in stats:
                    programs[int(stats["program_id"])] += 1
    return dict(times), [program for program, _ in programs.most_common()]


@contextlib.contextmanager
def torch_traced():
    """`torch.profiler` recording the GPU's kernels (CUDA activity only: the
    host side's own events would slow the host-bound steps it measures; on
    a machine without one, the host's, so that the stretch still runs)."""
    import torch

    activity = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[activity.CUDA if torch.cuda.is_available() else activity.CPU]) as profiler:
        yield profiler
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def torch_kernel_time(profiler):
    """`jax_kernel_time`'s summary of a `torch_traced` stretch, or None where
    no kernel ran on a GPU."""
    from torch.autograd import DeviceType

    by_name = collections.defaultdict(lambda: [0.0, 0])
    spans = []
    for event in profiler.events():
        if event.device_type != DeviceType.CUDA:
            continue
        start, end = event.time_range.start * 1000, event.time_range.end * 1000  # us -> ns
        by_name[event.name][0] += (end - start) / 1e9
        by_name[event.name][1] += 1
        spans.append((start, end, event.name))
    return _kernel_summary(by_name, spans) if by_name else None


def _kernel_summary(by_name, spans, host_lines=()):
    by_kind = collections.Counter()
    for name, (seconds, _) in by_name.items():
        by_kind[kind_of(name)] += seconds
    # 60 kept for the JSON report (what the other fusions are); 15 printed.
    top = sorted(by_name.items(), key=lambda item: -item[1][0])[:60]
    return {
        "seconds": sum(seconds for seconds, _ in by_name.values()),
        "idle": idle_gaps(spans, host_lines),
        "kernels": sum(count for _, count in by_name.values()),
        "by_kind": dict(by_kind.most_common()),
        "top": [{"name": name[:120], "seconds": seconds, "count": count} for name, (seconds, count) in top],
    }


def idle_gaps(spans, host_lines=(), long_ns=500_000):
    """Where no kernel ran between the first kernel's start and the last's
    end: `{"seconds", "long_gaps", "long_seconds", "around", "host"}`. The
    long gaps (at least `long_ns`) are waits on the host; the rest, between
    the kernels of a step, launch overhead. For the long gaps: the kernels
    on either side (most common pairs), and per host thread the innermost
    event under way in the gap's middle, with the gap time it covers."""
    spans.sort()
    idle = long_idle = 0
    gaps = []
    reach, last = (spans[0][1], spans[0][2]) if spans else (0, "")
    for start, end, name in spans[1:]:
        if start > reach:
            idle += start - reach
            if start - reach >= long_ns:
                long_idle += start - reach
                gaps.append((reach, start, last, name))
        if end > reach:
            reach, last = end, name
    around = collections.Counter()
    for begin, end, before, after in gaps:
        around[f"{before[:50]} -> {after[:50]}"] += (end - begin) / 1e9
    host = collections.Counter()
    for line in host_lines:
        events = [(event.start_ns, event.end_ns, event.name) for event in line.events]
        for begin, end, _, _ in gaps:
            middle = (begin + end) / 2
            under_way = [event for event in events if event[0] <= middle <= event[1]]
            if under_way:
                innermost = min(under_way, key=lambda event: event[1] - event[0])
                host[f"{line.name[:30]}: {innermost[2][:90]}"] += (end - begin) / 1e9
    return {
        "seconds": idle / 1e9,
        "long_gaps": len(gaps),
        "long_seconds": long_idle / 1e9,
        "around": around.most_common(6),
        "host": host.most_common(12),
    }


def kernel_markdown(summary, wall_seconds, steps):
    """A kernel summary per step, beside the stretch's wall time."""
    idle = summary["idle"]
    lines = [
        f"GPU kernels: {summary['seconds'] / steps * 1000:.2f} ms a step of {wall_seconds / steps * 1000:.2f} ms wall "
        f"({summary['seconds'] / wall_seconds:.0%} busy), {summary['kernels'] / steps:,.0f} kernels a step",
        f"GPU idle between its first and last kernel: {idle['seconds'] / steps * 1000:.2f} ms a step, "
        f"of which {idle['long_seconds'] / steps * 1000:.2f} ms in {idle['long_gaps']} gaps "
        "of 0.5 ms or more (waits on the host), the rest between kernels",
        "",
        "| long gaps: kernel before -> kernel after | ms a step |",
        "| --- | ---: |",
        *(f"| `{pair}` | {seconds / steps * 1000:.2f} |" for pair, seconds in idle["around"]),
        "",
        "| host thread: innermost event in a long gap's middle | gap ms a step |",
        "| --- | ---: |",
        *(f"| `{event}` | {seconds / steps * 1000:.2f} |" for event, seconds in idle["host"]),
        "",
        "| kind | ms a step | share of kernel time |",
        "| --- | ---: | ---: |",
        *(f"| {kind} | {seconds / steps * 1000:.2f} | {seconds / summary['seconds']:.0%} |"
          for kind, seconds in summary["by_kind"].items()),
        "",
        "| kernel | ms a step | launches a step |",
        "| --- | ---: | ---: |",
    ]
    for entry in summary["top"][:15]:
        lines.append(f"| `{entry['name'][:70]}` | {entry['seconds'] / steps * 1000:.3f} | {entry['count'] / steps:.0f} |")
    return "\n".join(lines)


# === XLA's operations by part of the model (JAX) ===
#
# XLA names its kernels after its own fused operations (`fusion_787`),
# which say nothing of the model. The optimized module, which XLA writes as
# text where `XLA_FLAGS` asks for it (`xla_dump_flags`), keeps for each
# operation the JAX name stack it came from: Keras's layer scopes
# (`decoder_block_3/cross_attention/query`), with `transpose(...)` around
# the backward pass.

XLA_PARTS = [
    # (part, words in the operation's name stack), the first that matches.
    ("Adam update", ("/adam",)),
    ("dropout", ("dropout",)),
    ("layer norm", ("_norm/", "norm/")),
    ("loss and metrics", ("compile_loss", "compile_metrics", "perplexity", "accuracy")),
    ("attention projections", ("/query", "/key", "/value", "/attention_output")),
    ("attention: scores, softmax, values", ("attention",)),
    ("feed-forward", ("feed_forward",)),
    ("embeddings and output projection", ("embedding", "output_projection")),
]
OTHER_PART = "other (copies, casts, residual adds)"

# `  %name = f32[..] opcode(...), ..., calls=%computation, metadata={op_name="..."}`
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = .*? ([\w\-]+)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")


def xla_dump_flags(directory, module="train_step"):
    """The `XLA_FLAGS` that write the optimized modules whose name holds
    `module` (Keras's JAX train step: `jit_train_step`) to `directory`."""
    return f"--xla_dump_to={directory} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*{module}.*"


def xla_operations(directory):
    """`{program: {operation: (name stack, is_matmul, is_backward)}}` for each
    optimized module in `directory` (`program`: the number XLA gives the
    module, which a trace's `program_id` names), over the operations a
    kernel can be named after (those outside fused computations)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, "module_*after_optimizations.txt"))):
        program = int(os.path.basename(path).split(".")[0].split("_")[1])
        with open(path) as file:
            found[program] = _read_module(file.read())
    return found


def module_of(times, found, programs=()):
    """The module `times` (`{operation: seconds}`) ran: the one among
    `programs` (the trace's), or else the one naming most of its time."""
    known = [program for program in programs if program in found]
    if known:
        return found[known[0]]

    def covered(operations):
        return sum(seconds for operation, seconds in times.items() if operation in operations)

    return max(found.values(), key=covered, default={})


def _read_module(text):
    computations = collections.defaultdict(list)  # name -> [(operation, opcode, line)]
    current = None
    for line in text.splitlines():
        heading = _COMPUTATION.match(line)
        if heading:
            current = heading.group(1)
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction and current is not None:
            computations[current].append((instruction.group(1), instruction.group(2), line))
    multiplying = {name for name, body in computations.items() if any(_multiplies(op, line) for _, op, line in body)}
    # A fusion whose own name stack names no part (a cast, or none) takes
    # the stack inside it that names one most often: the loss's gradient
    # fused into the logits' cast is the loss's.
    inner = {name: _most_telling([_stack(line) for _, _, line in body]) for name, body in computations.items()}
    found = {}
    for name, body in computations.items():
        if name.startswith(("fused_", "wrapped_")) or ".fused" in name:
            continue  # inside a fusion: no kernel of its own
        for operation, opcode, line in body:
            called = re.search(r"calls=%?([\w.\-]+)", line)
            called = called.group(1) if called else None
            matmul = _multiplies(opcode, line) or called in multiplying
            own = _stack(line)
            stack = own if part_of(own) != OTHER_PART else inner.get(called) or own
            found[operation] = (stack, matmul, "transpose(" in own + stack)
    return found


def _most_telling(stacks):
    telling = collections.Counter(stack for stack in stacks if part_of(stack) != OTHER_PART)
    return telling.most_common(1)[0][0] if telling else ""


def _stack(line):
    stack = re.search(r'op_name="([^"]*)"', line)
    return stack.group(1) if stack else ""


def _multiplies(opcode, line):
    if opcode in ("dot", "convolution"):
        return True
    target = re.search(r'custom_call_target="([^"]*)"', line)
    return opcode == "custom-call" and bool(target) and any(w in target.group(1).lower() for w in ("gemm", "matmul", "dot"))


def part_of(stack):
    """The part of the model an operation's name stack names."""
    return next((part for part, words in XLA_PARTS if any(word in stack for word in words)), OTHER_PART)


def by_part(times, found):
    """`{part: {"forward", "backward", "matmul"}}` seconds, from `times`
    (`{operation: seconds}`) and `found`, one module's `xla_operations`;
    operations it does not know go to `OTHER_PART`. The most time first."""
    parts = collections.defaultdict(lambda: {"forward": 0.0, "backward": 0.0, "matmul": 0.0})
    for operation, seconds in times.items():
        stack, matmul, backward = found.get(operation, ("", False, False))
        entry = parts[part_of(stack)]
        entry["backward" if backward else "forward"] += seconds
        if matmul:
            entry["matmul"] += seconds
    return dict(sorted(parts.items(), key=lambda item: -(item[1]["forward"] + item[1]["backward"])))


def parts_markdown(parts, steps):
    """`by_part`'s parts per step, as a table."""
    total = sum(entry["forward"] + entry["backward"] for entry in parts.values()) or 1.0
    lines = [
        "| part of the model | forward ms a step | backward ms a step | of which matmuls | share |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for part, entry in parts.items():
        lines.append(
            f"| {part} | {entry['forward'] / steps * 1000:.2f} | {entry['backward'] / steps * 1000:.2f} "
            f"| {entry['matmul'] / steps * 1000:.2f} | {(entry['forward'] + entry['backward']) / total:.0%} |"
        )
    return "\n".join(lines)


# === TensorFlow's operations by part of the model, on the CPU ===

TENSORFLOW_PARTS = [
    # (part, test on the operation's name), the first that matches.
    ("Adam update", lambda name: "/adam/" in name),
    ("loss and metrics over the vocabulary", lambda name: any(word in name for word in (
        "compile_loss", "LogSoftmax", "ArgMax", "perplexity", "masked_token_accuracy", "target_tokens"))),
    ("matmuls", lambda name: name.endswith(("MatMul", "Einsum", "BatchMatMulV2"))),
    ("layer norm", lambda name: "_norm" in name),
    ("dropout", lambda name: "dropout" in name or "StatelessRandom" in name),
]


def tensorflow_parts(logdir, steps):
    """`{part: thread-seconds per step}` of the operations TensorFlow's
    compute threads ran, from the `tf.profiler` trace in `logdir`: the
    threads' busy time added up, the most first."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0], "rb") as file:
        space.ParseFromString(file.read())
    parts = collections.Counter()
    for plane in space.planes:
        names = {key: value.name for key, value in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = names[event.metadata_id]
                if ":" not in name or "::" in name:
                    continue  # executor bookkeeping, not an operation
                part = next((part for part, test in TENSORFLOW_PARTS if test(name)), "other elementwise work")
                parts[part] += event.duration_ps / 1e12 / steps
    return dict(parts.most_common())


# === CTranslate2 in a process of its own ===
#
# After a CTranslate2 batch had run in the benchmark's process, torch's
# decoding there stayed slower, idle pauses or not: ours 1.05 -> 1.21 s and
# `transformers` 1.01 -> 1.06 s a batch (base, batch 32, greedy). With a
# float32 and an int8 translator loaded in one process, the float32 one ran
# at about half its speed, though the other was idle. So each CTranslate2
# model decodes in a worker process of its own, which imports nothing but
# CTranslate2. Requests and replies are pickled tuples, one each way:
# ("load", key, model_directory, compute_type, threads) -> ("ok", None);
# ("decode", key, batch, beam_size, output_length, alpha) -> ("ok", lengths),
# the length of each sentence's best hypothesis; a failure -> ("error", message).


def serve_ctranslate2(requests, replies):
    import ctranslate2

    translators = {}
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            kind, key, *arguments = request
            if kind == "load":
                directory, compute_type, threads = arguments
                translators[key] = ctranslate2.Translator(
                    directory, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads,
                )
                reply = ("ok", None)
            elif kind == "decode":
                batch, beam_size, output_length, alpha = arguments
                results = translators[key].translate_batch(
                    batch, beam_size=beam_size, max_batch_size=0, max_decoding_length=output_length,
                    min_decoding_length=output_length, length_penalty=alpha, num_hypotheses=1,
                )
                reply = ("ok", [len(result.hypotheses[0]) for result in results])
            else:
                reply = ("error", f"unknown request {kind!r}; expected 'load' or 'decode'")
        except Exception as error:  # noqa: BLE001 - sent back to the benchmark, which raises it
            reply = ("error", f"{type(error).__name__}: {error}")
        pickle.dump(reply, replies)
        replies.flush()


class CTranslate2Processes:
    """One worker process per CTranslate2 model, started on first use."""

    def __init__(self):
        self.processes = {}

    def ask(self, key, *request):
        """Sends `request` to `key`'s worker; returns its reply."""
        import subprocess

        if key not in self.processes:
            self.processes[key] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "ctranslate2-worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
        process = self.processes[key]
        pickle.dump(request, process.stdin)
        process.stdin.flush()
        try:
            status, reply = pickle.load(process.stdout)
        except EOFError:
            raise RuntimeError(f"the CTranslate2 process ended (exit code {process.wait()})") from None
        if status != "ok":
            raise RuntimeError(f"CTranslate2 process: {reply}")
        return reply

    def close(self):
        for process in self.processes.values():
            process.stdin.close()
            process.wait()
        self.processes = {}


# === The training ratios as one PNG ===


def collect_ratios(folder, prefer=()):
    """(label, value, target) for each ratio found in `folder`'s reports, in
    display order: `cpu_<backend>_small_float32.json` (training_speed.py)
    ours / keras-hub and ours / torch.nn.Transformer, the base model's share
    of the peak (`cpu_tensorflow_base_float32.json`), `precision_<backend>.json`
    (precision.py) and `bucketing_tensorflow.json` (input_pipeline.py
    --bucketing). `prefer`: suffixes, first wins: `<name>_SUFFIX.json` is
    read in place of `<name>.json` where it exists."""
    backends = ("tensorflow", "jax", "torch")

    def load(name):
        stem = name[: -len(".json")]
        for candidate in [f"{stem}_{suffix}.json" for suffix in prefer] + [name]:
            path = os.path.join(folder, candidate)
            if os.path.exists(path):
                print(f"{name}: reading {candidate}")
                with open(path) as file:
                    return json.load(file)
        return None

    bars = []
    training = {backend: load(f"cpu_{backend}_small_float32.json") for backend in backends}
    for ratio, label, target in (("ours/keras_hub", "keras-hub", 1.0), ("ours/torch", "torch.nn.Transformer", None)):
        for backend, report in training.items():
            if report and ratio in report["ratios"]:
                bars.append((f"ours / {label}, small fp32, {backend}", report["ratios"][ratio], target))
    report = load("cpu_tensorflow_base_float32.json")
    if report:
        bars.append(("ours, share of fp32 matmul peak, base, tensorflow", report["contenders"]["ours"]["mfu"], 0.75))
    for backend in backends:
        report = load(f"precision_{backend}.json")
        if report:
            bars.append((f"mixed_bfloat16 / float32, Multi30k, {backend}", report["mixed_bfloat16/float32"], 1.5))
    report = load("bucketing_tensorflow.json")
    if report:
        bars.append(("bucketed / padded batches, Multi30k, tensorflow", report["bucketed/padded"], 1.3))
    return bars


def plot_ratios(bars, path, title):
    """Horizontal bars of `collect_ratios`'s ratios, each with its target's line."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 0.45 * len(bars) + 1.2))
    axes = figure.add_subplot()
    positions = range(len(bars))[::-1]
    values = [value for _, value, _ in bars]
    colours = ["tab:gray" if target is None else ("tab:green" if value >= target else "tab:red")
               for _, value, target in bars]
    axes.barh(list(positions), values, color=colours)
    for position, (_, value, target) in zip(positions, bars):
        axes.text(max(value, target or 0), position, f" {value:.3g}", va="center")
        if target is not None:
            axes.plot([target, target], [position - 0.4, position + 0.4], color="black", linewidth=2)
    axes.set_yticks(list(positions), [label for label, _, _ in bars])
    axes.set_xlim(0, max(values + [1.5]) * 1.15)
    axes.set_xlabel("ratio (black line: target; green: met, red: missed, grey: no target)")
    axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


# === A CTranslate2 server, for `serve_load.py` ===

EOS_PIECE = "</s>"  # Marian's, which its converted models expect after the source


def ctranslate2_app(translator, source, target, beam_size, alpha, max_extra_length):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def translate_one(text):
        pieces = source.encode(text, out_type=str)
        (result,) = translator.translate_batch(
            [pieces + [EOS_PIECE]], beam_size=beam_size, length_penalty=alpha,
            max_decoding_length=len(pieces) + max_extra_length,
        )
        tokens = result.hypotheses[0]
        return {"translatedText": target.decode(tokens), "source_tokens": len(pieces), "tokens": len(tokens)}

    async def translate(request):
        values = await request.json()
        return JSONResponse(await run_in_threadpool(translate_one, values["q"]))

    async def health(request):
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/translate", translate, methods=["POST"]), Route("/health", health)])


def ctranslate2_server(arguments):
    """`python benchmarks/_support.py ctranslate2-server --model-dir CT2_DIR --source-spm S --target-spm T
    --beam-size 4 --alpha 1.0 --max-extra-length 50 --port P`: a CTranslate2 server of the kind users
    build, for `serve_load.py`. Starlette and uvicorn, as `keras-transformer serve`: `POST /translate`
    takes LibreTranslate's JSON, cuts the text into SentencePiece pieces, appends Marian's EOS, and calls
    `translate_batch` on that one sentence in Starlette's thread pool (a `ctranslate2.Translator` with
    one worker, `--threads` cores): each request alone, as a handler written for CTranslate2 does. The
    answer adds `source_tokens` and `tokens` (the pieces decoded), so that the lengths can be checked."""
    import argparse

    import ctranslate2
    import sentencepiece
    import uvicorn

    parser = argparse.ArgumentParser(prog="_support.py ctranslate2-server")
    parser.add_argument("--model-dir", required=True, help="a CTranslate2 model directory")
    parser.add_argument("--source-spm", required=True)
    parser.add_argument("--target-spm", required=True)
    parser.add_argument("--beam-size", type=int, required=True)
    parser.add_argument("--alpha", type=float, required=True, help="translate_batch's length_penalty")
    parser.add_argument("--max-extra-length", type=int, required=True, help="outputs: source pieces + this, at most")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="intra_threads")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5001)
    args = parser.parse_args(arguments)
    start = time.perf_counter()
    translator = ctranslate2.Translator(
        args.model_dir, device="cpu", compute_type="float32", inter_threads=1, intra_threads=args.threads
    )
    source = sentencepiece.SentencePieceProcessor(model_file=args.source_spm)
    target = sentencepiece.SentencePieceProcessor(model_file=args.target_spm)
    app = ctranslate2_app(translator, source, target, args.beam_size, args.alpha, args.max_extra_length)
    print(f"Serving CTranslate2 {ctranslate2.__version__} ({args.model_dir}) at http://{args.host}:{args.port}; "
          f"{args.threads} threads, loaded in {time.perf_counter() - start:.1f} s", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    if sys.argv[1:2] == ["ctranslate2-server"]:
        ctranslate2_server(sys.argv[2:])
        sys.exit(0)
    if sys.argv[1:] != ["ctranslate2-worker"]:
        sys.exit("usage: python benchmarks/_support.py ctranslate2-worker|ctranslate2-server ...  "
                 "(decoding_engines.py and serve_load.py start them)")
    # The replies take standard output's pipe; whatever else writes to
    # standard output goes to standard error instead.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve_ctranslate2(sys.stdin.buffer, replies)
