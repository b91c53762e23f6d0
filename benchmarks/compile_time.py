"""XLA's compile time and the step time of our train step, with and
without Triton's GEMM fusions, side by side (JAX).

    KERAS_BACKEND=jax python benchmarks/compile_time.py --size small \
        --corpus multi30k/train.en multi30k/train.de --tokens-per-batch 4096 --buckets 4

Under JAX the train step is compiled once per batch shape, and on a GPU
much of that time is XLA's autotuning of its GEMMs, which by default
tries Triton fusions of each product against cuBLAS. Each setting
(`SETTINGS`) runs in a fresh process, since XLA reads its flags once and
keeps what it autotuned: the model at `--size` (the Multi30k recipe's is
`small`), in `mixed_bfloat16`, compiled with `compile_model` and
`steps_per_execution` 8 (as `train` does), is given one batch of each
length that `TokenBatches` makes of the corpus (as `training_speed.py
--corpus` makes them). Per length: the first `fit` of 8 steps (compiling
included), then the median of `--rounds` fits of `--steps` steps.
Reported: both per length and in all, and each setting over the first.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Name: XLA flags added to the user's.
SETTINGS = {
    "XLA's default": "",
    "no Triton GEMMs": "--xla_gpu_enable_triton_gemm=false",
}
STEPS_PER_EXECUTION = 8


def child(args):
    """One setting, in this process: `{"device", "lengths": [...]}`."""
    sys.path.insert(0, HERE)
    import training_speed as speed

    size = speed.SIZES[args.size]
    batches = speed.corpus_data(*args.corpus, args.tokens_per_batch, args.buckets, args.sample, args.corpus_vocabulary)
    by_shape = {}
    for inputs, labels in batches:
        by_shape.setdefault((inputs["source_ids"].shape, labels.shape), (inputs, labels))
    vocabulary = size["vocabulary_size"]
    model = speed.our_model(size, "mixed_bfloat16")
    speed.compile_model(
        model, warmup_steps=speed.WARMUP_STEPS, label_smoothing=speed.LABEL_SMOOTHING,
        steps_per_execution=STEPS_PER_EXECUTION,
    )
    rows = []
    for (source_shape, target_shape), (inputs, labels) in sorted(by_shape.items(), key=lambda item: item[0][1][1]):
        for ids in (*inputs.values(), labels):  # the corpus's ids folded into the model's vocabulary
            ids[ids >= vocabulary] = speed.FIRST_ID + ids[ids >= vocabulary] % (vocabulary - speed.FIRST_ID)
        contender = speed.KerasContender("ours", model, [(inputs, labels)] * args.steps)
        start = time.perf_counter()
        contender.train(STEPS_PER_EXECUTION)
        first = time.perf_counter() - start
        turns = [contender.train(args.steps) for _ in range(args.rounds)]
        rows.append({
            "batch": list(target_shape), "source_length": source_shape[1],
            "first_fit_seconds": first, "step_seconds": statistics.median(turns) / args.steps,
        })
        print(f"  {target_shape}: first fit {first:.1f} s, {rows[-1]['step_seconds'] * 1000:.2f} ms a step", flush=True)
    return {"device": speed.keras_device()[1], "lengths": rows}


def run_setting(name, args):
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), SETTINGS[name]]))
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "setting.json")
        command = [sys.executable, os.path.abspath(__file__), "--child", out, *sys.argv[1:]]
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True)
        with open(out) as file:
            result = json.load(file)
    result["process_seconds"] = time.perf_counter() - start
    result["xla_flags"] = env["XLA_FLAGS"]
    return result


def markdown(report):
    names = list(report["settings"])
    first = report["settings"][names[0]]
    lines = [
        f"{report['device']}; {report['size']}, mixed_bfloat16, steps_per_execution {STEPS_PER_EXECUTION}; "
        f"{report['data']}",
        "",
        "| batch | " + " | ".join(f"{name}: first fit (s) | ms a step" for name in names) + " |",
        "| --- | " + " | ".join("---: | ---:" for _ in names) + " |",
    ]
    for index, row in enumerate(first["lengths"]):
        cells = []
        for name in names:
            other = report["settings"][name]["lengths"][index]
            cells.append(f"{other['first_fit_seconds']:.1f} | {other['step_seconds'] * 1000:.2f}")
        lines.append(f"| {row['batch'][0]} x {row['batch'][1]} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in names:
        setting = report["settings"][name]
        compile_seconds = sum(row["first_fit_seconds"] for row in setting["lengths"])
        step = statistics.mean(row["step_seconds"] for row in setting["lengths"])
        base_compile = sum(row["first_fit_seconds"] for row in first["lengths"])
        base_step = statistics.mean(row["step_seconds"] for row in first["lengths"])
        lines.append(
            f"{name} (`XLA_FLAGS={setting['xla_flags']}`): first fits {compile_seconds:.1f} s in all "
            f"({compile_seconds / base_compile:.2f}x the first setting's), mean step {step * 1000:.2f} ms "
            f"({base_step / step:.2f}x its speed), process {setting['process_seconds']:.0f} s"
        )
    return "\n".join(lines)


def check_corpus_and_backend(parser, corpus):
    """Exits through `parser` unless the `--corpus` files exist and Keras runs on JAX."""
    for path in corpus:
        if not os.path.isfile(path):
            parser.error(f"--corpus: no such file: {path}")
    if os.environ.get("KERAS_BACKEND") != "jax":
        parser.error(f"compiles JAX's train step: set KERAS_BACKEND=jax. Received: {os.environ.get('KERAS_BACKEND')}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "small", "base"], default="small")
    parser.add_argument("--corpus", nargs=2, metavar=("SOURCE", "TARGET"), required=True)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--corpus-vocabulary", type=int, default=8000,
                        help="the BPE vocabulary learned from the corpus, which sets the lengths")
    parser.add_argument("--sample", type=int, default=200, help="batches drawn to find every length")
    parser.add_argument("--steps", type=int, default=40, help="steps a timed fit; a multiple of 8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--out", help="where to write the JSON report")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.steps % STEPS_PER_EXECUTION or args.rounds < 1:
        parser.error(f"--steps must be a positive multiple of {STEPS_PER_EXECUTION} and --rounds >= 1. "
                     f"Received: {args.steps}, {args.rounds}")
    check_corpus_and_backend(parser, args.corpus)
    if args.child:
        with open(args.child, "w") as file:
            json.dump(child(args), file)
        return
    settings = {}
    for name in args.settings:
        print(f"{name}:", flush=True)
        settings[name] = run_setting(name, args)
    report = {
        "command": " ".join(["KERAS_BACKEND=jax", "python", *sys.argv]),
        "device": settings[args.settings[0]]["device"],
        "size": args.size,
        "data": f"one batch of each length of {os.path.basename(args.corpus[1])}, "
                f"TokenBatches of {args.tokens_per_batch:,} tokens a side, at most {args.buckets} lengths",
        "settings": settings,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as file:
            json.dump(report, file, indent=2)
    print(markdown(report))


if __name__ == "__main__":
    main()
