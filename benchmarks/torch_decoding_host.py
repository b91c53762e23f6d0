"""The host's work per decoding step under Keras's torch backend, beside
transformers' `generate`, on the CPU.

    KERAS_BACKEND=torch python benchmarks/torch_decoding_host.py

On a GPU, a torch decoding step launches its kernels one at a time, and at
batch 1 or 64 the GPU waits on the host (issue 45: ours decoded at
0.87-0.93x transformers on an H200, about 4 ms a step). This counts that
work where no GPU is: ours (`search_translations`, compiled as the
`Translator` compiles it) and `MarianMTModel.generate` at the base
preset's 6 + 6 layers but tiny widths (d_model 16, 2 heads, 100 ids), so
that the arithmetic is next to nothing. Both decode the same random
sources (20 tokens, then EOS) to exactly `--output-length` tokens and to
`--steps` more (in as many phases of our growing caches), EOS banned on
both sides; a step's figures are the difference over those steps, which
cancels what a call does once (its
time: the median of `--rounds` turns' differences; the contenders take
turns, and torch uses one thread, as the host's dispatch does).

Printed, per batch size and search: the torch operations a step
dispatches, those of them that compute (a kernel each on a GPU; not views
or bare allocations), the Python and built-in function calls, and ms a
step, with ours / transformers as a speed ratio.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from gpu_decoding import ours  # noqa: E402
from marian_peer import random_marian  # noqa: E402
from marian_peer import transformers_contender  # noqa: E402
from torch_host_time import dispatched_operations  # noqa: E402
from torch_host_time import function_calls  # noqa: E402

import keras_transformer as kt  # noqa: E402

SIZE = {"num_layers": 6, "d_model": 16, "num_heads": 2, "d_ff": 32, "vocabulary_size": 100}
ALPHA = 0.6


def per_step(measure, short, long, steps):
    """`measure(long) - measure(short)` over the `steps` between them."""
    return (measure(long) - measure(short)) / steps


def seconds(decode):
    start = time.perf_counter()
    decode()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--output-length", type=int, default=40)
    parser.add_argument("--steps", type=int, default=20, help="steps a step's figures are taken over")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--num-layers", type=int, default=SIZE["num_layers"], help="blocks a stack (the base preset's 6)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    import torch

    if keras.backend.backend() != "torch":
        sys.exit(f"error: this measures Keras's torch backend; KERAS_BACKEND is {keras.backend.backend()!r}")
    if args.steps < 1 or args.output_length <= args.source_length + 1:
        sys.exit(
            f"error: --steps must be at least 1 and --output-length above --source-length + 1; received "
            f"--steps {args.steps}, --output-length {args.output_length}, --source-length {args.source_length}"
        )
    phases = [len(kt.decoding.cache_lengths(n) or [n]) for n in (args.output_length, args.output_length + args.steps)]
    if phases[0] != phases[1]:
        # A phase's start (its caches grown, its traces looked up) is work a call does once.
        sys.exit(
            f"error: --output-length and --output-length + --steps must fall in the same phase of the "
            f"growing caches (lengths 16, 32, 64, ...); received {args.output_length} and "
            f"{args.output_length + args.steps}, in {phases[0]} and {phases[1]} phases"
        )
    torch.set_num_threads(1)
    size = SIZE | {"num_layers": args.num_layers}
    keras.utils.set_random_seed(0)
    model = kt.build_transformer("base", **size)
    marian = random_marian(size)
    lengths = (args.output_length, args.output_length + args.steps)
    rng = np.random.default_rng(0)
    rows = []
    for batch_size in args.batch_sizes:
        source_ids = rng.integers(4, size["vocabulary_size"] - 2, (batch_size, args.source_length + 1)).astype("int32")
        source_ids[:, -1] = 3  # EOS
        for beam_size in (1, 4):
            decoders = {
                "ours": [ours(model, beam_size, n, args.source_length + 1)(source_ids) for n in lengths],
                "transformers": [transformers_contender(marian, beam_size, n, ALPHA)(source_ids) for n in lengths],
            }
            row = {"batch_size": batch_size, "beam_size": beam_size}
            for name, (short, long) in decoders.items():
                short(), long(), short(), long()  # records at the second call, warms up
                operations = per_step(lambda decode: np.array(dispatched_operations(decode)), short, long, args.steps)
                calls = per_step(function_calls, short, long, args.steps)
                row[name] = {"operations": operations[0], "computing_operations": operations[1], "function_calls": calls}
            times = {name: [] for name in decoders}
            for _ in range(args.rounds):
                for name, (short, long) in decoders.items():
                    times[name].append((seconds(long) - seconds(short)) / args.steps)
            for name in decoders:
                row[name]["ms_per_step"] = 1000 * statistics.median(times[name])
            row["ours_speed_over_transformers"] = row["transformers"]["ms_per_step"] / row["ours"]["ms_per_step"]
            rows.append(row)
            search = "greedy" if beam_size == 1 else f"beam {beam_size}"
            for name in decoders:
                figures = row[name]
                print(
                    f"batch {batch_size}, {search}, {name:12s} {figures['ms_per_step']:6.2f} ms a step, "
                    f"{figures['operations']:6.0f} torch operations ({figures['computing_operations']:4.0f} computing), "
                    f"{figures['function_calls']:6.0f} function calls"
                )
            print(f"batch {batch_size}, {search}: ours / transformers, speed: {row['ours_speed_over_transformers']:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"size": size, "rows": rows, "torch": torch.__version__}, file, indent=1)


if __name__ == "__main__":
    main()
