"""Training throughput of a preset on this machine, under $KERAS_BACKEND.

    KERAS_BACKEND=jax python benchmarks/training_throughput.py --preset base

Builds the preset with a 37,000-token vocabulary, compiles it with the
paper's setup (`keras_transformer.training.compile_model`), warms `fit` up so
that compiling is not timed, then times `fit` on fixed-shape batches of
random token ids. Prints the step time and the tokens per second (source
plus target tokens; there is no padding).
"""

import argparse
import time

import keras
import numpy as np

import keras_transformer as kt


class StepTimer(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--dtype", default=None)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    shape = (args.batch_size * (args.steps + 2), args.length)
    inputs = {
        "source_ids": rng.integers(4, 37000, shape).astype("int32"),
        "target_ids": rng.integers(4, 37000, shape).astype("int32"),
    }
    labels = rng.integers(4, 37000, shape).astype("int32")
    model = kt.build_transformer(args.preset, vocabulary_size=37000, dtype=args.dtype)
    kt.training.compile_model(model)
    warm = args.batch_size * 2
    model.fit(
        {k: v[:warm] for k, v in inputs.items()}, labels[:warm],
        batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False,
    )
    timer = StepTimer()
    model.fit(
        {k: v[warm:] for k, v in inputs.items()}, labels[warm:],
        batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False,
        callbacks=[timer],
    )
    step = float(np.median(np.diff(timer.times)))
    tokens = 2 * args.batch_size * args.length
    print(
        f"{keras.backend.backend()}: preset {args.preset} "
        f"({model.count_params():,} parameters), batches of "
        f"{args.batch_size}x{args.length} source + target tokens: "
        f"{step * 1000:.0f} ms/step, {tokens / step:,.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
