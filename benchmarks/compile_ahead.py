"""The first `fit` of a corpus's batches under JAX, its train step compiled
for all the batch lengths at once (ours) against one length after another
as each first comes (Keras's), side by side.

    KERAS_BACKEND=jax python benchmarks/compile_ahead.py --size small \
        --corpus multi30k/train.en multi30k/train.de --tokens-per-batch 4096 --buckets 4

`fit` on `TokenBatches` compiles the step for every shape its steps will
meet before the first (`backend/jax_steps.py`); the same batches through a
plain `keras.utils.PyDataset` leave it to Keras. Each way runs in a fresh
process without JAX's persistent cache, `--rounds` times in turns: the
model at `--size` in `mixed_bfloat16` (the vocabulary the corpus's), with
`steps_per_execution` 8 as `train` compiles it, trains the first batches
until every length has come (a multiple of 8). Printed: the fit's seconds
(compiling and those steps), each way's median, and ours / Keras's speed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from compile_time import check_corpus_and_backend

HERE = os.path.dirname(os.path.abspath(__file__))
WAYS = ("at once", "one by one")
STEPS_PER_EXECUTION = 8


def child(args):
    """One way, in this process: the fit's seconds and what it trained."""
    sys.path.insert(0, HERE)
    import keras
    import training_speed as speed

    batches = speed.corpus_batches(*args.corpus, args.tokens_per_batch, args.buckets, args.corpus_vocabulary)
    lengths = set(batches.lengths[batches.pairs_per_bucket > 0].tolist())
    steps, met = 0, set()
    while met != lengths:
        met.add(batches[steps][1].shape[1])
        steps += 1
    steps = -(-steps // STEPS_PER_EXECUTION) * STEPS_PER_EXECUTION
    size = dict(speed.SIZES[args.size], vocabulary_size=batches.vocabulary_size)
    model = speed.our_model(size, "mixed_bfloat16")
    speed.compile_model(
        model, warmup_steps=speed.WARMUP_STEPS, label_smoothing=speed.LABEL_SMOOTHING,
        steps_per_execution=STEPS_PER_EXECUTION,
    )

    class Plain(keras.utils.PyDataset):
        def __getitem__(self, index):
            return batches[index]

        @property
        def num_batches(self):
            return None

    data = batches if args.child_way == "at once" else Plain()
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    return {"seconds": time.perf_counter() - start, "steps": steps, "lengths": sorted(lengths),
            "device": speed.keras_device()[1]}


def run_way(way, args):
    env = {key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "way.json")
        command = [sys.executable, os.path.abspath(__file__), "--child", out, "--child-way", way, *sys.argv[1:]]
        subprocess.run(command, env=env, check=True)
        with open(out) as file:
            return json.load(file)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "small", "base"], default="small")
    parser.add_argument("--corpus", nargs=2, metavar=("SOURCE", "TARGET"), required=True)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--corpus-vocabulary", type=int, default=8000, help="the BPE vocabulary learned from the corpus")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="where to write the JSON report")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-way", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1. Received: {args.rounds}")
    check_corpus_and_backend(parser, args.corpus)
    if args.child:
        with open(args.child, "w") as file:
            json.dump(child(args), file)
        return
    runs = {way: [] for way in WAYS}
    for round_ in range(args.rounds):
        for way in WAYS[round_ % 2 :] + WAYS[: round_ % 2]:
            runs[way].append(run_way(way, args))
            print(f"{way}: {runs[way][-1]['seconds']:.1f} s", flush=True)
    first = runs[WAYS[0]][0]
    median = {way: statistics.median(run["seconds"] for run in runs[way]) for way in WAYS}
    report = {
        "command": " ".join(["KERAS_BACKEND=jax", "python", *sys.argv]),
        "device": first["device"], "size": args.size, "steps": first["steps"], "lengths": first["lengths"],
        "seconds": {way: [run["seconds"] for run in runs[way]] for way in WAYS},
        "median_seconds": median,
        "ours_speed_over_keras": median["one by one"] / median["at once"],
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as file:
            json.dump(report, file, indent=2)
    print(f"{report['device']}; {args.size}, mixed_bfloat16; the first {first['steps']} steps, "
          f"{len(first['lengths'])} lengths ({', '.join(map(str, first['lengths']))})")
    print(f"first fit, median of {args.rounds}: all lengths at once {median['at once']:.1f} s, "
          f"one by one {median['one by one']:.1f} s; ours / Keras's {report['ours_speed_over_keras']:.2f}x")


if __name__ == "__main__":
    main()
