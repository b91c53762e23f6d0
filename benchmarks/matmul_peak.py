"""The matmul rate a Keras backend reaches, in float32 and bfloat16, on this machine.

    KERAS_BACKEND=jax python benchmarks/matmul_peak.py [--sizes 1024 2048 4096] [--seconds 2]

`keras.ops.matmul` of two n x n matrices, repeated for about `--seconds`
seconds per size and dtype after one untimed call (which compiles, under
JAX). It prints GFLOP/s (2 n^3 per product) and the bfloat16 / float32
ratio: the most that mixed_bfloat16 can gain on a model whose time is all
matrix products, under this backend, on this machine.
"""

import argparse
import json
import time

import keras


def wait_for(product):
    """Blocks until `product` is computed, reading one element (as float32:
    NumPy cannot take a bfloat16 scalar from TensorFlow)."""
    keras.ops.convert_to_numpy(keras.ops.cast(product[0, 0], "float32"))


def matmul_rate(size, dtype, seconds):
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", help="where to write the rates")
    args = parser.parse_args()
    if min(args.sizes) < 1 or args.seconds <= 0:
        parser.error(f"sizes and seconds must be positive. Received: {args.sizes}, {args.seconds}")

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


if __name__ == "__main__":
    main()
