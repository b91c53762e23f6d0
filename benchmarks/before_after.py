"""Decoding and training speed of this tree beside another revision, in one run.

    python benchmarks/before_after.py --before HEAD~3
    python benchmarks/before_after.py --before v0.4 --backends torch --rounds 2
    python benchmarks/before_after.py --before HEAD~3 --rounds 3 --no-training
    python benchmarks/before_after.py --before HEAD~3 --backends torch --rounds 3 --no-decoding
    python benchmarks/before_after.py --before HEAD~3 --programs

The other revision is checked out into a temporary git worktree. For each
backend, each round runs both trees' own `benchmarks/decoding.py` (batch
32, small and base, greedy and beam 4, with keras-hub's beam sampler;
TensorFlow with XLA) and `benchmarks/training_speed.py` (small, float32,
ours alone) in fresh processes, one tree after the other, the order turning
each round so that the machine's drift falls on both. Reported: the best
of the rounds for each tree and its after over before; the median of the
rounds' own after over before (the two trees of a round ran minutes
apart, where the drift over a run can be larger than the change); and
ours over keras-hub for beam 4 in this tree. keras-hub's rows are the
same code in both trees: their after / before shows the run's noise.

`--programs` compares what the two trees compile instead of timing it:
this tree's `compiled_programs.py` runs with each tree's package, and the
digests of each backend's decoding programs are compared.
"""

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODING_LINE = re.compile(r"^\s+(small|base)\s+(greedy, cached|beam 4, cached|beam 4, keras-hub BeamSampler)\s+([\d.]+) sentences/s")


@contextlib.contextmanager
def worktree(revision):
    directory = tempfile.mkdtemp(prefix="before-")
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", directory, revision], check=True, capture_output=True)
    try:
        yield directory
    finally:
        subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", directory], capture_output=True)


def run(tree, backend, arguments):
    """`python <arguments>` in `tree` (a script path relative to it, or
    absolute), with its own package first on the path."""
    # Both trees with the command line's process settings (which a tree from
    # before they left `import keras_transformer` applies at import anyway).
    environment = {
        **os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": tree, "TF_CPP_MIN_LOG_LEVEL": "3",
        "KERAS_TRANSFORMER_QUIET": "1",
    }
    result = subprocess.run([sys.executable, *arguments], cwd=tree, env=environment, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(arguments)} failed in {tree}:\n{result.stderr[-3000:]}")
    return result.stdout


def decoding(tree, backend):
    """Sentences per second by (preset, route)."""
    arguments = ["benchmarks/decoding.py", "--skip-recompute", "small", "base"]
    if backend == "tensorflow":
        arguments.append("--jit-compile")
    figures = {}
    for line in run(tree, backend, arguments).splitlines():
        match = DECODING_LINE.match(line)
        if match:
            figures[(match.group(1), match.group(2))] = float(match.group(3))
    return figures


def training(tree, backend, steps, rounds):
    """Target tokens per second of ours, small, float32."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        run(tree, backend, [
            "benchmarks/training_speed.py", "--size", "small", "--precision", "float32", "--contenders",
            "--steps", str(steps), "--rounds", str(rounds), "--out", report.name,
        ])  # fmt: skip
        with open(report.name) as file:
            return json.load(file)["contenders"]["ours"]["target_tokens_per_second"]


def programs(trees, backends):
    """Whether each backend's decoding programs agree between the trees."""
    script = os.path.join(HERE, "benchmarks", "compiled_programs.py")
    for backend in backends:
        digests = {name: json.loads(run(tree, backend, [script]).splitlines()[-1]) for name, tree in trees.items()}
        for cell in digests["after"]:
            same = digests["before"][cell] == digests["after"][cell]
            size = sum(digests["after"][cell].values()) if backend != "jax" else digests["after"][cell]["lines"]
            print(f"| {backend} | {cell} | {'same' if same else 'different'} | {size:,} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a git revision")
    parser.add_argument("--backends", nargs="+", default=["jax", "tensorflow", "torch"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--train-steps", type=int, default=10, help="timed steps per training turn")
    parser.add_argument("--train-rounds", type=int, default=3, help="training turns per run")
    parser.add_argument("--no-training", action="store_true", help="time decoding only")
    parser.add_argument("--no-decoding", action="store_true", help="time training only")
    parser.add_argument("--out", help="also write the figures here as JSON")
    parser.add_argument("--programs", action="store_true", help="compare the compiled decoding programs, not speed")
    args = parser.parse_args()
    if args.no_training and args.no_decoding:
        parser.error("--no-training and --no-decoding leave nothing to time; give at most one")
    if args.programs:
        with worktree(args.before) as before:
            print("| backend | search, batch 32 | program | size (HLO lines, or operations) |\n| --- | --- | --- | ---: |")
            programs({"before": before, "after": HERE}, args.backends)
        return
    per_round = {}  # (backend, cell, tree) -> figure of each round
    with worktree(args.before) as before:
        trees = {"before": before, "after": HERE}
        for backend in args.backends:
            for round_number in range(args.rounds):
                order = ["before", "after"] if round_number % 2 == 0 else ["after", "before"]
                for name in order:
                    figures = {} if args.no_decoding else {
                        f"{preset} {route}": value for (preset, route), value in decoding(trees[name], backend).items()
                    }
                    if not args.no_training:
                        figures["train small float32"] = training(trees[name], backend, args.train_steps, args.train_rounds)
                    for cell, value in figures.items():
                        per_round.setdefault((backend, cell, name), []).append(value)
                    print(f"{backend} round {round_number + 1} {name}: {figures}", flush=True)
    best = {key: max(values) for key, values in per_round.items()}
    lines = [
        "| backend | measure | before (best) | after (best) | after / before | rounds' after / before (median) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for backend in args.backends:
        cells = sorted({cell for b, cell, _ in best if b == backend})
        for cell in cells:
            old, new = best[(backend, cell, "before")], best[(backend, cell, "after")]
            ratios = [a / b for a, b in zip(per_round[(backend, cell, "after")], per_round[(backend, cell, "before")])]
            lines.append(f"| {backend} | {cell} | {old:,.1f} | {new:,.1f} | {new / old:.2f} | {statistics.median(ratios):.2f} |")
        for preset in ("small", "base"):
            ours = best.get((backend, f"{preset} beam 4, cached", "after"))
            theirs = best.get((backend, f"{preset} beam 4, keras-hub BeamSampler", "after"))
            if ours and theirs:
                lines.append(f"| {backend} | {preset} beam 4, ours / keras-hub (after) | | | {ours / theirs:.2f} | |")
    print("\nDecoding in sentences/s (batch 32); training in target tokens/s.\n")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as file:
            json.dump(
                {
                    "best": {" | ".join(key): value for key, value in best.items()},
                    "rounds": {" | ".join(key): values for key, values in per_round.items()},
                },
                file,
                indent=2,
            )


if __name__ == "__main__":
    main()
