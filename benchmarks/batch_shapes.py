"""Our train step at a bucket length with `tokens_per_batch // length` rows
against the rows `TokenBatches` now takes (`aligned_rows`: a few fewer,
so that the batch's tokens are a multiple of 64), side by side in one
process, as target tokens a second.

    KERAS_BACKEND=jax python benchmarks/batch_shapes.py --size base --lengths 54 22

The model at `--size` in `mixed_bfloat16`, compiled with `compile_model`
and `steps_per_execution` 8 (as `train` does), is fitted on random ids of
each shape: first a fit of 8 steps (compiling included), then `--rounds`
turns of `--steps` steps, the two shapes of a length taking turns. XLA on a
GPU pads the operands of each product over the tokens to a multiple of 64
rows when they are not; on a CPU both shapes should run at one speed.
`--dropout 0` (the paper's is 0.1) bounds what drawing the dropout masks
costs a step, against a run at 0.1 on the same machine.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS_PER_EXECUTION = 8


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "small", "base"], default="small")
    parser.add_argument("--lengths", type=int, nargs="+", default=[54, 22], help="bucket lengths, both sides")
    parser.add_argument("--tokens-per-batch", type=int, default=25000)
    parser.add_argument("--steps", type=int, default=16, help="steps a timed fit; a multiple of 8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.1,
                        help="the model's (0.1 in the paper); 0 shows what drawing the masks costs")
    parser.add_argument("--out", help="where to write the JSON report")
    args = parser.parse_args()
    if args.steps < 1 or args.steps % STEPS_PER_EXECUTION or args.rounds < 1:
        parser.error(f"--steps must be a positive multiple of {STEPS_PER_EXECUTION} and --rounds >= 1. "
                     f"Received: {args.steps}, {args.rounds}")
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1). Received: {args.dropout}")
    if min(args.lengths) < 2 or args.tokens_per_batch < max(args.lengths):
        parser.error(f"--lengths must be at least 2 and at most --tokens-per-batch. Received: {args.lengths}")
    sys.path.insert(0, HERE)
    import numpy as np
    import training_speed as speed

    from keras_transformer.data.batches import aligned_rows

    size = speed.SIZES[args.size]
    model = speed.our_model(size, "mixed_bfloat16", dropout=args.dropout)
    speed.compile_model(
        model, warmup_steps=speed.WARMUP_STEPS, label_smoothing=speed.LABEL_SMOOTHING,
        steps_per_execution=STEPS_PER_EXECUTION,
    )
    rng = np.random.default_rng(0)
    rows = []
    for length in args.lengths:
        plain = args.tokens_per_batch // length
        contenders = {}
        for name, batch in (("plain", plain), ("aligned", aligned_rows(plain, length))):
            def ids():
                return rng.integers(speed.FIRST_ID, size["vocabulary_size"], (batch, length)).astype("int32")

            data = [({"source_ids": ids(), "target_ids": ids()}, ids())] * args.steps
            contenders[name] = (batch, speed.KerasContender(name, model, data))
        first = {}
        for name, (_, contender) in contenders.items():
            start = time.perf_counter()
            contender.train(STEPS_PER_EXECUTION)
            first[name] = time.perf_counter() - start
        turns = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, (_, contender) in contenders.items():
                turns[name].append(contender.train(args.steps))
        row = {"length": length}
        for name, (batch, _) in contenders.items():
            step = statistics.median(turns[name]) / args.steps
            row[name] = {
                "rows": batch, "tokens": batch * length, "first_fit_seconds": first[name],
                "step_seconds": step, "target_tokens_per_second": batch * length / step,
            }
        row["aligned_over_plain"] = row["aligned"]["target_tokens_per_second"] / row["plain"]["target_tokens_per_second"]
        rows.append(row)
        print(f"length {length}: " + ", ".join(
            f"{name} {row[name]['rows']} x {length}: {row[name]['step_seconds'] * 1000:.2f} ms a step, "
            f"{row[name]['target_tokens_per_second']:,.0f} tokens/s" for name in contenders
        ) + f"; aligned / plain {row['aligned_over_plain']:.3f}", flush=True)
    report = {
        "command": " ".join([f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', '')}", "python", *sys.argv]),
        "device": speed.keras_device()[1],
        "size": args.size,
        "precision": "mixed_bfloat16",
        "steps_per_execution": STEPS_PER_EXECUTION,
        "dropout": args.dropout,
        "lengths": rows,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as file:
            json.dump(report, file, indent=2)


if __name__ == "__main__":
    main()
