"""torch's float32 products on the CPU: its own `matmul` (MKL) against
oneDNN's linear operation, at the shapes of our training steps and decoding
steps, alternating in one run.

    python benchmarks/torch_cpu_products.py [--seconds 0.3] [--rounds 3] [--json out.json]

The package's layers compute their products with oneDNN under torch on the
CPU, except on an Intel CPU under a torch built with MKL
(`keras_transformer/backend/products.py`, `onednn_preferred`). This script
measures what that rule rests on, on this machine: for each product, the
rate of both (2 M K N flops per product, median of `--rounds` turns of about
`--seconds` each) and `matmul / oneDNN`, the speed of torch's product over
oneDNN's. A training product is timed as its forward product and both its
gradients (`dx = dy W^T`, `dW = x^T dy`), as `torch_products` computes them
with oneDNN; a decoding product as the forward one, from 1 to 128 rows.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")  # the package's torch path is what this measures
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import torch  # noqa: E402

from keras_transformer import environment  # noqa: E402
from keras_transformer.backend import products as torch_products  # noqa: E402

# (name, d_model, d_ff, vocabulary, training tokens per step) of the presets
# the benchmarks train and decode.
SIZES = [("small", 256, 1024, 8000, 64 * 32), ("base", 512, 2048, 8000, 32 * 32)]
DECODING_ROWS = [1, 4, 8, 32, 128]


def products(sizes, decoding_rows):
    """(size, use, rows, depth, columns) of each product to time: the
    attention projections, the feed-forward layers and the output
    projection, of training and of decoding."""
    found = []
    for name, d_model, d_ff, vocabulary, tokens in sizes:
        shapes = [(d_model, d_model), (d_model, d_ff), (d_ff, d_model), (d_model, vocabulary)]
        for depth, columns in shapes:
            for use in ("forward", "input gradient", "kernel gradient"):
                found.append((name, use, tokens, depth, columns))
            for rows in decoding_rows:
                found.append((name, "decoding", rows, depth, columns))
    return found


def contenders(use, rows, depth, columns, linear):
    """(matmul, oneDNN) as functions of no arguments computing the product
    as `torch_products` does for `use`, and its flop count."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, depth, generator=generator)
    kernel = torch.randn(depth, columns, generator=generator)
    gradient = torch.randn(rows, columns, generator=generator)
    if use == "input gradient":  # [M, N] by [N, K]
        pair = (lambda: gradient @ kernel.t(), lambda: linear(gradient, kernel))
    elif use == "kernel gradient":  # [K, M] by [M, N]
        pair = (lambda: x.t() @ gradient, lambda: linear(x.t(), gradient.t()))
    else:
        pair = (lambda: x @ kernel, lambda: linear(x, kernel.t()))
    return pair, 2 * rows * depth * columns


def rate(compute, flops, seconds):
    """Flops per second of `compute()` repeated for about `seconds`."""
    compute()
    count = 0
    start = time.perf_counter()
    while True:
        compute()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return flops * count / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="per contender and turn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", choices=[s[0] for s in SIZES], default=[s[0] for s in SIZES])
    parser.add_argument("--decoding-rows", type=int, nargs="+", default=DECODING_ROWS)
    parser.add_argument("--json", help="where to write the rates")
    args = parser.parse_args()
    if args.seconds <= 0 or args.rounds < 1 or min(args.decoding_rows) < 1:
        parser.error(
            "--seconds, --rounds and --decoding-rows must be positive. Received: "
            f"{args.seconds}, {args.rounds}, {args.decoding_rows}"
        )
    linear = torch_products.onednn_linear()
    if linear is None:
        sys.exit("error: this build of torch has no oneDNN linear operation: nothing to compare.")

    torch.set_grad_enabled(False)
    vendor = environment.cpu_vendor() or "unknown"
    choice = "oneDNN" if torch_products.onednn_preferred() else "torch.matmul"
    print(
        f"{environment.describe_machine()}, vendor {vendor}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, MKL {'yes' if torch.backends.mkl.is_available() else 'no'}; "
        f"the package multiplies with {choice} here\n"
    )
    print("| size | product | M x K x N | torch.matmul GFLOP/s | oneDNN GFLOP/s | matmul / oneDNN |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    sizes = [size for size in SIZES if size[0] in args.sizes]
    results = []
    for name, use, rows, depth, columns in products(sizes, args.decoding_rows):
        (matmul, onednn), flops = contenders(use, rows, depth, columns, linear)
        rates = {"matmul": [], "onednn": []}
        for _ in range(args.rounds):  # alternating, so that both share the machine's noise
            rates["matmul"].append(rate(matmul, flops, args.seconds))
            rates["onednn"].append(rate(onednn, flops, args.seconds))
        medians = {key: statistics.median(values) for key, values in rates.items()}
        ratio = medians["matmul"] / medians["onednn"]
        print(
            f"| {name} | {use} | {rows} x {depth} x {columns} | {medians['matmul'] / 1e9:,.1f} "
            f"| {medians['onednn'] / 1e9:,.1f} | {ratio:.2f} |",
            flush=True,
        )
        results.append(
            {"size": name, "use": use, "shape": [rows, depth, columns], "flops_per_second": medians, "matmul/onednn": ratio}
        )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(
                {"machine": environment.describe_machine(), "vendor": vendor, "package_uses": choice,
                 "torch": torch.__version__, "results": results},
                file, indent=2,
            )


if __name__ == "__main__":
    main()
