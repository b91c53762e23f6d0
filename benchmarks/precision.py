"""float32 against mixed_bfloat16 training on Multi30k batches, in one run.

    KERAS_BACKEND=tensorflow python benchmarks/precision.py [--data-dir multi30k] [--steps 10] [--rounds 3] [--json OUT]
    KERAS_BACKEND=jax python benchmarks/precision.py --matmul-peak [--sizes 1024 2048 4096] [--seconds 2] [--json OUT]

Builds the Multi30k recipe's model (3+3 layers, d_model 256, dropout 0.3,
8,000-piece vocabulary) once per precision, with the same initial weights,
and trains each on the same 4,096-token batches of Multi30k. The two
alternate in rounds of `--steps` steps, so both see the machine's noise. It
prints the median step time of each and their ratio (float32 time over
mixed_bfloat16 time: above 1 means bfloat16 is faster), after a warm-up on
one batch of each shape, which compiles every shape.

`--matmul-peak` trains nothing: it times `keras.ops.matmul` of two n x n
matrices (each `--sizes`), float32 and bfloat16, for about `--seconds` each
after an untimed call (which compiles, under JAX), and prints GFLOP/s
(2 n^3 a product) and bfloat16 / float32: the most that mixed_bfloat16 can
gain on a model whose time is all matrix products, under this backend, on
this machine.
"""

import argparse
import json
import os
import time

import keras
import numpy as np
from _support import fit_batches
from _support import matmul_rate
from _support import one_batch_per_shape
from _support import step_times

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import make_dataset
from keras_transformer.data import read_parallel_text

DEFAULT_DATA = "multi30k"  # github.com/multi30k/dataset, data/task1/raw, unzipped
ARCHITECTURE = {"num_layers": 3, "d_model": 256, "d_ff": 1024, "num_heads": 4, "dropout": 0.3}


def matmul_peak(args):
    """`--matmul-peak`: the backend's float32 and bfloat16 matmul rates."""
    rates = {}
    print(f"Keras backend {keras.backend.backend()}\n")
    print("| n | float32 GFLOP/s | bfloat16 GFLOP/s | bfloat16 / float32 |")
    print("| ---: | ---: | ---: | ---: |")
    for size in args.sizes:
        float32 = matmul_rate(size, "float32", args.seconds)
        bfloat16 = matmul_rate(size, "bfloat16", args.seconds)
        rates[size] = {"float32": float32, "bfloat16": bfloat16}
        print(f"| {size} | {float32 / 1e9:,.0f} | {bfloat16 / 1e9:,.0f} | {bfloat16 / float32:.2f} |")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"keras_backend": keras.backend.backend(), "flops_per_second": rates}, file, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--json", help="where to write the figures")
    parser.add_argument("--matmul-peak", action="store_true", help="time the backend's matmuls alone, no training")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096], help="with --matmul-peak")
    parser.add_argument("--seconds", type=float, default=2.0, help="with --matmul-peak: per size and dtype")
    args = parser.parse_args()
    if args.matmul_peak:
        if min(args.sizes) < 1 or args.seconds <= 0:
            parser.error(f"--sizes and --seconds must be positive. Received: {args.sizes}, {args.seconds}")
        matmul_peak(args)
        return

    corpus = read_parallel_text(
        os.path.join(args.data_dir, "train.en"), os.path.join(args.data_dir, "train.de")
    )
    tokenizer = SubwordTokenizer.train(corpus, args.vocabulary_size)
    # A fixed list of batches: every model trains on exactly these.
    dataset = make_dataset(corpus, tokenizer, args.tokens_per_batch, max_length=128, seed=0)
    batches = [dataset[i] for i in range(min(len(dataset), args.steps * args.rounds + 1))]
    warmup = one_batch_per_shape(batches)  # compiles every shape first

    models = {}
    for dtype in ("float32", "mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        model = kt.build_transformer(
            "small", vocabulary_size=tokenizer.vocabulary_size, **ARCHITECTURE,
            dtype=None if dtype == "float32" else dtype,
        )
        kt.training.compile_model(model, warmup_steps=2000)
        start = time.perf_counter()
        fit_batches(model, warmup)
        print(f"{dtype}: warm-up on {len(warmup)} batch shapes {time.perf_counter() - start:.0f}s", flush=True)
        models[dtype] = model

    step_seconds = {dtype: [] for dtype in models}
    tokens = {dtype: 0 for dtype in models}
    for round_index in range(args.rounds):
        chunk = batches[round_index * args.steps : (round_index + 1) * args.steps]
        chunk_tokens = sum(int((np.asarray(labels) != 0).sum()) for _, labels in chunk)
        for dtype, model in models.items():
            timer = step_times()
            fit_batches(model, chunk, [timer])
            step_seconds[dtype] += list(np.diff([timer.begin] + timer.ends))
            tokens[dtype] += chunk_tokens
        print(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
            f"{d} {np.median(t) * 1000:.0f} ms/step" for d, t in step_seconds.items()), flush=True)

    medians = {dtype: float(np.median(times)) for dtype, times in step_seconds.items()}
    for dtype, median in medians.items():
        rate = tokens[dtype] / sum(step_seconds[dtype])
        print(f"{keras.backend.backend()} {dtype}: median {median * 1000:.0f} ms/step, "
              f"{rate:,.0f} target tokens/s over {len(step_seconds[dtype])} steps")
    speedup = medians["float32"] / medians["mixed_bfloat16"]
    print(f"mixed_bfloat16 speedup over float32: {speedup:.2f}x")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({
                "keras_backend": keras.backend.backend(),
                "median_step_seconds": medians,
                "target_tokens_per_second": {
                    dtype: tokens[dtype] / sum(step_seconds[dtype]) for dtype in models
                },
                "mixed_bfloat16/float32": speedup,
            }, file, indent=2)


if __name__ == "__main__":
    main()
