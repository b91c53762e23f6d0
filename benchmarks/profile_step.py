"""Where a training step of our model spends its time, on random token ids.

    KERAS_BACKEND=tensorflow python benchmarks/profile_step.py --size base [--profile]

Builds our model at `training_speed.py`'s size (`small` or `base`: 32 tokens
per sentence, dropout 0.1, the paper's Adam and label smoothing), trains one
step to compile, then `--rounds` calls of `fit` of `--steps` steps each, and
prints each step's time, taken inside `fit` by a callback (what `fit` does
before the first step and after the last is printed apart).

With `--profile` (TensorFlow only), the last round runs under `tf.profiler`,
and the script sums the time of the operations TensorFlow ran, per part of
the model (matmuls, attention, feed-forward, loss, Adam, ...), in
thread-seconds per step: the two compute threads' busy time added up.
"""

import argparse
import collections
import glob
import sys
import tempfile
import time

import keras
import numpy as np
import training_speed as speed
from fit_timing import StepTimes

PARTS = [
    # (part, test on the operation's name), the first that matches.
    ("Adam update", lambda name: "/adam/" in name),
    ("loss and metrics over the vocabulary",
     lambda name: any(word in name for word in (
         "compile_loss", "LogSoftmax", "ArgMax", "perplexity",
         "masked_token_accuracy", "target_tokens"))),
    ("matmuls", lambda name: name.endswith(("MatMul", "Einsum", "BatchMatMulV2"))),
    ("layer norm", lambda name: "_norm" in name),
    ("dropout", lambda name: "dropout" in name or "StatelessRandom" in name),
]


def profile_parts(logdir, steps):
    """Thread-seconds per step of each part, from TensorFlow's trace."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0], "rb") as file:
        space.ParseFromString(file.read())
    parts = collections.Counter()
    for plane in space.planes:
        names = {key: value.name for key, value in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = names[event.metadata_id]
                if ":" not in name or "::" in name:
                    continue  # executor bookkeeping, not an operation
                part = next((part for part, test in PARTS if test(name)), "other elementwise work")
                parts[part] += event.duration_ps / 1e12 / steps
    return parts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["tiny", "small", "base"], default="small")
    parser.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="TensorFlow only: profile the last round")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps and --rounds must be >= 1. Received: {args.steps}, {args.rounds}")
    if args.profile and keras.backend.backend() != "tensorflow":
        parser.error(f"--profile reads TensorFlow's trace; the backend is {keras.backend.backend()}")

    size = dict(speed.SIZES[args.size])
    batch_size, length = size["batch_size"], size["length"]
    keras.utils.set_random_seed(0)
    model = speed.our_model(size, dtype=None if args.precision == "float32" else args.precision)
    speed.compile_model(model, warmup_steps=speed.WARMUP_STEPS, label_smoothing=speed.LABEL_SMOOTHING)
    batches = speed.random_data(size, args.steps)
    inputs = {key: np.concatenate([batch[0][key] for batch in batches]) for key in batches[0][0]}
    labels = np.concatenate([batch[1] for batch in batches])

    def fit(steps, callbacks=()):
        model.fit(
            {key: value[: steps * batch_size] for key, value in inputs.items()},
            labels[: steps * batch_size], batch_size=batch_size, epochs=1,
            shuffle=False, verbose=0, callbacks=list(callbacks),
        )

    start = time.perf_counter()
    fit(1)
    print(f"{keras.backend.backend()}, {args.size}, {args.precision}: first step "
          f"(compiles) {time.perf_counter() - start:.1f} s", flush=True)
    logdir = tempfile.mkdtemp(prefix="profile_step_")
    all_steps = []
    for round_index in range(args.rounds):
        profiled = args.profile and round_index == args.rounds - 1
        if profiled:
            import tensorflow as tf

            tf.profiler.experimental.start(logdir)
        timer = StepTimes()
        start = time.perf_counter()
        fit(args.steps, [timer])
        end = time.perf_counter()
        if profiled:
            tf.profiler.experimental.stop()
        steps = np.diff([timer.first] + timer.ends)
        all_steps += list(steps)
        print(f"round {round_index + 1}{' (profiled)' if profiled else ''}: steps "
              f"{', '.join(f'{s * 1000:.0f}' for s in steps)} ms; before the first step "
              f"{(timer.first - start) * 1000:.0f} ms, after the last {(end - timer.ends[-1]) * 1000:.0f} ms",
              flush=True)
    median = float(np.median(all_steps))
    flops = speed.matmul_flops(**size)
    print(f"median step {median * 1000:.0f} ms: {batch_size * length / median:,.0f} target tokens/s, "
          f"{flops / median / 1e9:,.0f} GFLOP/s of matmuls")
    if args.profile:
        parts = profile_parts(logdir, args.steps)
        total = sum(parts.values())
        print("\n| part of the step | thread-s per step | share |\n| --- | ---: | ---: |")
        for part, seconds in parts.most_common():
            print(f"| {part} | {seconds:.4f} | {seconds / total:.0%} |")
        print(f"| all | {total:.4f} | |")
        matmul = parts["matmuls"]
        if matmul:
            print(f"\nmatmuls: {flops / matmul / 1e9:.0f} GFLOP/s per thread while they run")


if __name__ == "__main__":
    sys.exit(main())
