"""Which part of the model each of XLA's operations in a JAX train step belongs to.

XLA names its kernels after its own fused operations (`fusion_787`,
`loop_convert_fusion`), which say nothing of the model. The optimized
module, which XLA writes as text where `XLA_FLAGS` asks for it
(`dump_flags`), keeps for each operation the JAX name stack it came from:
Keras's layer scopes (`decoder_block_3/cross_attention/query`), with
`transpose(...)` around the backward pass. `operations(directory)` reads
that back; `by_part(times, found)` sums a trace's time per operation
(`device_trace.operation_time`) into the parts of the model, forward and
backward, matrix products apart.
"""

import collections
import glob
import os
import re

PARTS = [
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
OTHER = "other (copies, casts, residual adds)"

# `  %name = f32[..] opcode(...), ..., calls=%computation, metadata={op_name="..."}`
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = .*? ([\w\-]+)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")


def dump_flags(directory, module="train_step"):
    """The `XLA_FLAGS` that write the optimized modules whose name holds
    `module` (Keras's JAX train step: `jit_train_step`) to `directory`."""
    return f"--xla_dump_to={directory} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*{module}.*"


def operations(directory):
    """`{program: {operation: (name stack, is_matmul, is_backward)}}` for each optimized
    module in `directory` (`program`: the number XLA gives the module, which
    a trace's `program_id` names), over the operations a kernel can be
    named after (those outside fused computations)."""
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
    covered = lambda operations: sum(seconds for operation, seconds in times.items() if operation in operations)  # noqa: E731
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
    multiplying = {name for name, body in computations.items() if any(_multiplies(opcode, line) for _, opcode, line in body)}
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
            stack = own if part_of(own) != OTHER else inner.get(called) or own
            found[operation] = (stack, matmul, "transpose(" in own + stack)
    return found


def _most_telling(stacks):
    telling = collections.Counter(stack for stack in stacks if part_of(stack) != OTHER)
    return telling.most_common(1)[0][0] if telling else ""


def _stack(line):
    stack = re.search(r'op_name="([^"]*)"', line)
    return stack.group(1) if stack else ""


def _multiplies(opcode, line):
    if opcode in ("dot", "convolution"):
        return True
    target = re.search(r'custom_call_target="([^"]*)"', line)
    return opcode == "custom-call" and bool(target) and any(word in target.group(1).lower() for word in ("gemm", "matmul", "dot"))


def part_of(stack):
    """The part of the model an operation's name stack names."""
    return next((part for part, words in PARTS if any(word in stack for word in words)), OTHER)


def by_part(times, found):
    """`{part: {"forward", "backward", "matmul"}}` seconds, from `times`
    (`{operation: seconds}`) and `found`, one module's `operations`;
    operations it does not know go to `OTHER`."""
    parts = collections.defaultdict(lambda: {"forward": 0.0, "backward": 0.0, "matmul": 0.0})
    for operation, seconds in times.items():
        stack, matmul, backward = found.get(operation, ("", False, False))
        entry = parts[part_of(stack)]
        entry["backward" if backward else "forward"] += seconds
        if matmul:
            entry["matmul"] += seconds
    return dict(sorted(parts.items(), key=lambda item: -(item[1]["forward"] + item[1]["backward"])))


def markdown(parts, steps):
    """The parts per step, as a table."""
    total = sum(entry["forward"] + entry["backward"] for entry in parts.values()) or 1.0
    lines = [
        "| part of the model | forward ms a step | backward ms a step | of which matmuls | share |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for part, entry in parts.items():
        both = entry["forward"] + entry["backward"]
        lines.append(
            f"| {part} | {entry['forward'] / steps * 1000:.2f} | {entry['backward'] / steps * 1000:.2f} "
            f"| {entry['matmul'] / steps * 1000:.2f} | {both / total:.0%} |"
        )
    return "\n".join(lines)
