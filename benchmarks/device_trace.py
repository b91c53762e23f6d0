"""Where a traced stretch of JAX or torch work spent the GPU's time: kernel time by kind.

`traced(directory)` wraps `jax.profiler.trace`; `kernel_time(directory)`
reads the trace back with `jax.profiler.ProfileData` (no TensorFlow, no
TensorBoard) and sums the kernels that ran on the GPU's streams, by kind
(matmuls, fused attention, the rest of XLA's fusions, copies) and by name.
`torch_traced()` and `torch_kernel_time(profiler)` do the same with
`torch.profiler` for torch work (Keras's torch backend, or torch's own).
Beside the wall time of the same stretch it says how busy the GPU was: a
step whose kernels add up to much less than its wall time waits on the
host or on launches, not on arithmetic.
"""

import collections
import contextlib
import glob
import os

KINDS = [
    # (kind, words in a kernel's name, lower case), the first that matches.
    ("fused attention (cuDNN)", ("cudnn", "fmha", "flash", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "dot")),
    ("scatter (embedding gradients)", ("scatter",)),
    ("copy or transfer", ("memcpy", "memset", "copy")),
]


def kind_of(name):
    lower = name.lower()
    return next((kind for kind, words in KINDS if any(word in lower for word in words)), "other XLA fusions")


@contextlib.contextmanager
def traced(directory):
    import jax

    with jax.profiler.trace(directory):
        yield


def _newest_planes(directory):
    """The planes of the newest JAX trace under `directory` (none if none)."""
    from jax.profiler import ProfileData

    paths = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    return list(ProfileData.from_file(paths[-1]).planes) if paths else []


def kernel_time(directory):
    """`{"seconds", "kernels", "by_kind", "top"}` of the GPU kernels in the
    newest trace under `directory`, or None where it holds no GPU plane."""
    planes = _newest_planes(directory)
    if not planes:
        return None
    by_name = collections.defaultdict(lambda: [0.0, 0])
    found = False
    lines = set()
    spans = []  # (start, end) of every kernel, in ns
    for plane in planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        found = True
        for line in plane.lines:
            lines.add(line.name)
            # Kernels sit on the stream lines; "XLA Ops" and "XLA Modules"
            # restate the same time per operation and per program.
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                entry = by_name[event.name]
                entry[0] += event.duration_ns / 1e9
                entry[1] += 1
                spans.append((event.start_ns, event.end_ns, event.name))
    if not found:
        return None
    host_lines = [line for plane in planes if plane.name.startswith("/host:") for line in plane.lines]
    if not by_name:
        raise ValueError(f"The trace's GPU planes hold no stream lines; its lines: {sorted(lines)}")
    return _summary(by_name, spans, host_lines)


def operation_time(directory, module="train_step"):
    """`({operation: seconds}, programs)` per XLA operation (as named in the
    optimized module, `xla_parts.py`) in the newest trace under
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
    """`kernel_time`'s summary of a `torch_traced` stretch, or None where no
    kernel ran on a GPU."""
    from torch.autograd import DeviceType

    by_name = collections.defaultdict(lambda: [0.0, 0])
    spans = []
    for event in profiler.events():
        if event.device_type != DeviceType.CUDA:
            continue
        start, end = event.time_range.start * 1000, event.time_range.end * 1000  # us -> ns
        entry = by_name[event.name]
        entry[0] += (end - start) / 1e9
        entry[1] += 1
        spans.append((start, end, event.name))
    if not by_name:
        return None
    return _summary(by_name, spans)


def _summary(by_name, spans, host_lines=()):
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


def markdown(summary, wall_seconds, steps):
    """The summary per step, beside the stretch's wall time."""
    per_step = summary["seconds"] / steps
    lines = [
        f"GPU kernels: {per_step * 1000:.2f} ms a step of {wall_seconds / steps * 1000:.2f} ms wall "
        f"({summary['seconds'] / wall_seconds:.0%} busy), {summary['kernels'] / steps:,.0f} kernels a step",
        f"GPU idle between its first and last kernel: {summary['idle']['seconds'] / steps * 1000:.2f} ms a step, "
        f"of which {summary['idle']['long_seconds'] / steps * 1000:.2f} ms in {summary['idle']['long_gaps']} gaps "
        "of 0.5 ms or more (waits on the host), the rest between kernels",
        "",
        "| long gaps: kernel before -> kernel after | ms a step |",
        "| --- | ---: |",
        *(f"| `{pair}` | {seconds / steps * 1000:.2f} |" for pair, seconds in summary["idle"]["around"]),
        "",
        "| host thread: innermost event in a long gap's middle | gap ms a step |",
        "| --- | ---: |",
        *(f"| `{event}` | {seconds / steps * 1000:.2f} |" for event, seconds in summary["idle"]["host"]),
        "",
        "| kind | ms a step | share of kernel time |",
        "| --- | ---: | ---: |",
    ]
    for kind, seconds in summary["by_kind"].items():
        lines.append(f"| {kind} | {seconds / steps * 1000:.2f} | {seconds / summary['seconds']:.0%} |")
    lines += ["", "| kernel | ms a step | launches a step |", "| --- | ---: | ---: |"]
    for entry in summary["top"][:15]:
        lines.append(f"| `{entry['name'][:70]}` | {entry['seconds'] / steps * 1000:.3f} | {entry['count'] / steps:.0f} |")
    return "\n".join(lines)
