"""Training speed with the package's malloc setting beside glibc's default, in one run.

    python benchmarks/heap.py --backends tensorflow jax torch --rounds 2

The package sets glibc's malloc up when it is imported
(`keras_transformer/environment.py`): large tensors come from the heap, and
freed memory is kept for the next step's tensors instead of being given
back to the OS and page-faulted in again. It keeps glibc's default where
the user has chosen an allocator, which is how the other arm runs here:
with `GLIBC_TUNABLES=glibc.malloc.check=0`, a tunable at its default value.

For each backend, each round runs `training_speed.py` (ours alone, random
ids, `--size`) once under each setting, in fresh processes, the order
turning each round so that the machine's drift falls on both. Reported per
backend and setting: target tokens/s (the best round), and the process's
system CPU seconds and minor page faults (the median round); then the
heap's tokens/s over the default's.
"""

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {
    "heap": {},
    "glibc default": {"GLIBC_TUNABLES": "glibc.malloc.check=0"},
}


def describe_machine():
    """environment.py's machine description, without importing the package
    (and with it a backend) in this process."""
    path = os.path.join(os.path.dirname(HERE), "keras_transformer", "environment.py")
    spec = importlib.util.spec_from_file_location("environment", path)
    environment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(environment)
    return environment.describe_machine()


def child_usage():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_stime, usage.ru_minflt


def one_run(backend, setting, args, directory):
    out = os.path.join(directory, "speed.json")
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("MALLOC_") and name not in ("LD_PRELOAD", "GLIBC_TUNABLES")
    }
    env.update(SETTINGS[setting], KERAS_BACKEND=backend)
    command = [
        sys.executable, os.path.join(HERE, "training_speed.py"), "--size", args.size,
        "--contenders", "--steps", str(args.steps), "--rounds", "3", "--out", out,
    ]
    before = child_usage()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    after = child_usage()
    if result.returncode != 0:
        sys.exit(f"error: {backend}, {setting}: training_speed.py failed:\n{result.stderr[-2000:]}")
    with open(out) as file:
        report = json.load(file)
    return {
        "target_tokens_per_second": report["contenders"]["ours"]["target_tokens_per_second"],
        "system_seconds": after[0] - before[0],
        "minor_page_faults": after[1] - before[1],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", choices=["tensorflow", "jax", "torch"],
                        default=["tensorflow", "jax", "torch"])
    parser.add_argument("--size", default="small", help="training_speed.py's --size")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="where to write the JSON report")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error(f"--rounds and --steps must be >= 1. Received: {args.rounds}, {args.steps}")
    report = {"size": args.size, "steps": args.steps, "rounds": args.rounds,
              "machine": describe_machine(), "backends": {}}
    with tempfile.TemporaryDirectory() as directory:
        for backend in args.backends:
            runs = {setting: [] for setting in SETTINGS}
            for round_index in range(args.rounds):
                order = list(SETTINGS)[:: 1 if round_index % 2 == 0 else -1]
                for setting in order:
                    runs[setting].append(one_run(backend, setting, args, directory))
            report["backends"][backend] = {
                setting: {
                    "target_tokens_per_second": max(r["target_tokens_per_second"] for r in rs),
                    "system_seconds": statistics.median(r["system_seconds"] for r in rs),
                    "minor_page_faults": statistics.median(r["minor_page_faults"] for r in rs),
                }
                for setting, rs in runs.items()
            }
    print(f"ours, {args.size}, float32, {report['machine']}; best of {args.rounds} fresh processes per setting")
    print("| backend | malloc | target tokens/s | system CPU s | minor page faults | heap / default |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for backend, results in report["backends"].items():
        ratio = results["heap"]["target_tokens_per_second"] / results["glibc default"]["target_tokens_per_second"]
        results["heap_over_default"] = ratio
        for setting in SETTINGS:
            r = results[setting]
            print(f"| {backend} | {setting} | {r['target_tokens_per_second']:,.0f} | {r['system_seconds']:.1f} | "
                  f"{r['minor_page_faults']:,.0f} | {f'{ratio:.2f}x' if setting == 'heap' else ''} |")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as file:
            json.dump(report, file, indent=2)


if __name__ == "__main__":
    main()
