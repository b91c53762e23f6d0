"""Translating files of any size: peak memory and lines a second of
`keras-transformer translate` at 10,000 and 1,000,000 lines.

    python benchmarks/translate_scale.py --model-dir runs/quickstart \
        --corpus ../shared/data/multi30k/train.en --json benchmarks/results/translate_scale.json

For each `--lines` count, the `--corpus` lines repeated to that count are
translated by the command, greedy (`--beam-size`), in a process of its
own, to a file: its peak resident memory (the kernel's `ru_maxrss` of
that process), its lines a second from start to end, and those of the
translation alone (the command's own `--progress` figure, from its first
window on: loading and start-up left out, compiling the search in). Then
`--order-lines` lines twice more, once in length-sorted windows and once
with `--window` equal to `--batch-size`: every batch in the file's own
sentence order, to show what sorting buys. Printed: a row per run, the
peak at the largest count over the peak at the smallest, and sorted over
file order in translation lines a second.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time


def repeated(corpus, count, path):
    """Writes `corpus`'s lines, repeated, to `path` until it has `count`."""
    with open(corpus, encoding="utf-8") as file:
        lines = [line.rstrip("\n") for line in file if line.strip()]
    if not lines:
        sys.exit(f"error: {corpus} has no lines to translate")
    with open(path, "w", encoding="utf-8") as file:
        for start in range(0, count, len(lines)):
            file.write("".join(line + "\n" for line in lines[: count - start]))


def translate(args, source, output, window):
    """Runs the command; returns (seconds, peak RSS in MiB, its own lines a
    second of translation)."""
    command = [
        sys.executable, "-m", "keras_transformer", "translate", "--model-dir", args.model_dir,
        "--input", source, "--output", output, "--beam-size", str(args.beam_size),
        "--batch-size", str(args.batch_size), "--window", str(window), "--progress",
    ]
    start = time.perf_counter()
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    error = process.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{error[-2000:]}")
    rates = re.findall(r"translated [\d,]+ of [\d,]+ lines \(100\.0%\), ([\d,.]+) lines/s", error)
    if not rates:
        sys.exit(f"error: no final progress line from {' '.join(command)}:\n{error[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, float(rates[-1].replace(",", ""))  # ru_maxrss: KiB on Linux


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="a translator's directory (the quick start's)")
    parser.add_argument("--corpus", required=True, help="source lines to repeat")
    parser.add_argument("--lines", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--window", type=int, default=4096, help="the command's --window (its default)")
    parser.add_argument("--order-lines", type=int, default=100_000, help="lines translated in both orders")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        plan = [(count, args.window, "length-sorted windows") for count in args.lines]
        plan += [(args.order_lines, args.window, "sorted, beside"), (args.order_lines, args.batch_size, "the file's order")]
        for count, window, order in plan:
            source = os.path.join(directory, f"{count}.txt")
            if not os.path.exists(source):
                repeated(args.corpus, count, source)
            output = os.path.join(directory, "out.txt")
            seconds, peak, rate = translate(args, source, output, window)
            with open(output, "rb") as file:
                written = sum(1 for _ in file)
            if written != count:
                sys.exit(f"error: the command wrote {written} lines for {count}")
            run = {"lines": count, "window": window, "order": order, "seconds": seconds,
                   "lines_per_second": count / seconds, "translation_lines_per_second": rate, "peak_rss_mib": peak}
            runs.append(run)
            print(f"{count:>10,} lines, window {window:>5}, {order:22s} {seconds:9.1f} s "
                  f"{run['lines_per_second']:8.1f} lines/s ({rate:,.1f} translating)  peak {peak:7.1f} MiB", flush=True)
    sorted_runs = [run for run in runs if run["order"] == "length-sorted windows"]
    smallest, largest = sorted_runs[0], sorted_runs[-1]
    ratio = largest["peak_rss_mib"] / smallest["peak_rss_mib"]
    print(f"peak at {largest['lines']:,} lines / at {smallest['lines']:,}: {ratio:.3f}")
    order_ratio = runs[-2]["translation_lines_per_second"] / runs[-1]["translation_lines_per_second"]
    print(f"length-sorted windows / the file's order, translation lines/s at {args.order_lines:,} lines: {order_ratio:.2f}")
    if args.json:
        import keras

        from keras_transformer import environment

        report = {
            "command": " ".join(["python", *sys.argv]),
            "backend": keras.backend.backend(),
            "machine": environment.describe_machine(),
            "versions": {"keras": keras.__version__, "python": platform.python_version()},
            "runs": runs,
            "peak_ratio": ratio,
            "sorted_over_file_order": order_ratio,
        }
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
