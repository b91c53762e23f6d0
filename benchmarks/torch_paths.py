"""What each of the package's torch-only decoding paths buys: the same
search with one path switched off at a time, in one run, on the CPU.

    KERAS_BACKEND=torch python benchmarks/torch_paths.py [--presets small base] [--rounds 3] [--json out.json]

Under torch a translator's compiled function (`decoding.compiled`) runs
the search eagerly with three paths of its own:

- `direct`: our built layers call each other's `call` without
  `Layer.__call__` (`layers/calls.py`);
- `recorded loops`: the search's loops recorded with torch.fx's `make_fx`
  once per shapes and replayed (`backend/loops.py`);
- `products`: float32 products through oneDNN's linear operation or
  torch's `matmul`, whichever a rule takes as the faster on this CPU
  (`backend/products.py`, `onednn_preferred`).

Each variant decodes the same batch of random sources (`--source-length`
tokens, then EOS) to exactly `--output-length` tokens (EOS never ends a
sentence) with greedy search and beam 4: everything on; each path off in
turn (for the products, the other library's); and none of them, which is
Keras's own eager layers and loop (with the products the rule picks). The
variants take turns, `--rounds` times, in a rotating order, after two
untimed calls each (the loops are recorded at the second). Printed per
preset and search: sentences per second (median of the turns) and each
variant's speed over everything on (the median over rounds of the
round's ratio, which the machine's bursts of load disturb less).

Training's torch-only path, the choice of products with their gradients,
is measured by `training_speed.py --contenders ours_other_products`.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")  # the torch paths are what this measures
# The process settings the command line decodes with (`environment.configure_process`).
os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer import environment  # noqa: E402
from keras_transformer.backend import loops as backend_loops  # noqa: E402
from keras_transformer.backend import products  # noqa: E402
from keras_transformer.decoding import search_translations  # noqa: E402
from keras_transformer.decoding.compiled import CompiledFunction  # noqa: E402
from training_speed import other_products  # noqa: E402

BOS, EOS, NEVER = 2, 3, -1
# (direct calls, recorded loops, the rule's products) of each variant.
VARIANTS = {
    "all": (True, True, True),
    "no direct calls": (False, True, True),
    "no recorded loops": (True, False, True),
    "other products": (True, True, False),
    "none (Keras eager)": (False, False, True),
}


def variant(model, fn, inputs, direct, loops):
    """`fn` compiled as a translator compiles it, with its options set to
    `direct` calls and `loops` recorded or not."""
    compiled = CompiledFunction(fn, model, [x.ndim for x in inputs])
    compiled.decoding = dataclasses.replace(
        compiled.decoding, direct=direct, loops=backend_loops.TracedLoops(model) if loops else None
    )
    return compiled


def measure(preset, args):
    model = kt.build_transformer(preset, vocabulary_size=args.vocabulary_size)
    rng = np.random.default_rng(0)
    words = rng.integers(4, args.vocabulary_size, (args.batch_size, args.source_length))
    source = np.concatenate([words, np.full((args.batch_size, 1), EOS)], axis=1).astype("int32")
    limits = np.full((args.batch_size,), args.output_length, "int32")
    inputs = (source, limits)
    rows = {}
    for beam_size in (1, 4):
        search = "greedy" if beam_size == 1 else f"beam {beam_size}"

        def fn(source, limit, decoding, beam_size=beam_size):
            return search_translations(
                model, source, limit, beam_size=beam_size, alpha=0.6,
                max_extra_length=args.output_length - source.shape[1], bos_id=BOS, eos_id=NEVER, decoding=decoding,
            )

        contenders = {}
        for name in args.variants:
            direct, loops, rule = VARIANTS[name]
            compiled = variant(model, fn, inputs, direct, loops)
            context = contextlib.nullcontext if rule else other_products
            with context():
                for _ in range(2):
                    compiled(*inputs)
            contenders[name] = (compiled, context)
        times = {name: [] for name in contenders}
        names = list(contenders)
        for turn in range(args.rounds):
            for name in names[turn % len(names):] + names[: turn % len(names)]:
                compiled, context = contenders[name]
                with context():
                    start = time.perf_counter()
                    compiled(*inputs)
                    times[name].append(time.perf_counter() - start)
        rows[search] = {
            name: {
                "sentences_per_second": args.batch_size / statistics.median(seconds),
                "seconds": seconds,
                # Each turn beside the same round's "all": the machine's
                # episodes of load fall on both.
                "over_all": statistics.median(a / b for a, b in zip(times["all"], seconds)) if "all" in times else None,
            }
            for name, seconds in times.items()
        }
        for name, row in rows[search].items():
            ratio = f"{row['over_all']:.2f}" if row["over_all"] is not None else "-"
            print(f"  {preset:5s} {search:7s} {name:20s} {row['sentences_per_second']:8.1f} sentences/s  {ratio}x",
                  flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base"])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--output-length", type=int, default=40)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if keras.backend.backend() != "torch":
        sys.exit(f"error: this measures the torch backend's paths; KERAS_BACKEND is {keras.backend.backend()!r}")
    if args.output_length <= args.source_length + 1:
        sys.exit(f"error: --output-length must exceed --source-length + 1 (the EOS); got {args.output_length}")
    keras.utils.set_random_seed(0)
    import torch

    chosen = "oneDNN's" if products.onednn_preferred() else "torch's matmul"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, products: {chosen}; batch {args.batch_size}, "
          f"{args.source_length} source tokens + EOS, {args.output_length} output tokens", flush=True)
    report = {
        "command": " ".join(["python"] + sys.argv),
        "machine_detail": environment.describe_machine(),
        "products": chosen,
        "versions": {"keras": keras.__version__, "torch": torch.__version__},
        "presets": {preset: measure(preset, args) for preset in args.presets},
    }
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
