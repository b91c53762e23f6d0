"""Does mixed_bfloat16 train as well as float32? Loss curves against the seed-to-seed spread.

    python benchmarks/precision_loss.py [--steps 500] [--seeds 3] [--json out.json]

On the built-in corpus (the quick start's 20,000 training pairs, 800-piece
vocabulary, 2,048-token batches), the tiny preset trains `--steps` steps
with `compile_model` (the paper's Adam, schedule with 200 warm-up steps,
label smoothing 0.1), once per seed and precision. A seed sets the initial
weights, the dropout and the order of the batches; float32 and
mixed_bfloat16 runs of one seed start from the same weights and see the same
batches.

The loss is the mean training loss over windows of `--window` steps (each
window one Keras epoch). Per window it reports the float32 runs' mean and
their spread (largest minus smallest, over seeds), the mixed_bfloat16 mean,
and the gap between the two means over that spread. A gap within the spread
(|gap| / spread <= 1) is what two float32 runs of different seeds show.
"""

import argparse
import json
import time

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import builtin_corpus
from keras_transformer.data import make_dataset

TOKENS_PER_BATCH = 2048
VOCABULARY_SIZE = 800
BUCKET_STEP = 1.4  # the quick start's: few shapes to compile


def loss_curve(corpus, tokenizer, precision, seed, steps, window):
    keras.utils.set_random_seed(seed)
    model = kt.build_transformer(
        "tiny", vocabulary_size=tokenizer.vocabulary_size,
        dtype=None if precision == "float32" else precision, seed=seed,
    )
    kt.training.compile_model(model, warmup_steps=200)
    dataset = make_dataset(
        corpus, tokenizer, TOKENS_PER_BATCH, repeat=True, seed=seed, bucket_step=BUCKET_STEP
    )
    history = model.fit(
        dataset, epochs=steps // window, steps_per_epoch=window, shuffle=False, verbose=0
    )
    return history.history["loss"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--window", type=int, default=25, help="steps per point of the curve")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=20000, help="pairs of the built-in corpus")
    parser.add_argument("--json", help="where to write the curves")
    args = parser.parse_args()
    if args.window < 1 or args.steps < args.window or args.seeds < 2 or args.train_size < 1:
        parser.error("needs --window >= 1, --steps >= --window, --seeds >= 2 (a spread needs "
                     f"two) and --train-size >= 1. Received: {vars(args)}")

    corpus = builtin_corpus("train", size=args.train_size)
    tokenizer = SubwordTokenizer.train(corpus, VOCABULARY_SIZE)
    curves = {"float32": [], "mixed_bfloat16": []}
    for seed in range(args.seeds):
        for precision in curves:
            start = time.perf_counter()
            curves[precision].append(
                loss_curve(corpus, tokenizer, precision, seed, args.steps, args.window)
            )
            print(f"seed {seed} {precision}: final window loss {curves[precision][-1][-1]:.4f} "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)

    float32 = np.array(curves["float32"])
    bfloat16 = np.array(curves["mixed_bfloat16"])
    spread = float32.max(axis=0) - float32.min(axis=0)
    gap = bfloat16.mean(axis=0) - float32.mean(axis=0)
    ratio = np.abs(gap) / np.maximum(spread, 1e-12)
    print(f"\nbackend {keras.backend.backend()}; {args.seeds} seeds; loss averaged over windows of "
          f"{args.window} steps\n")
    print("| steps | float32 mean | float32 spread | mixed_bfloat16 mean | gap | gap / spread |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for index in range(len(spread)):
        end = (index + 1) * args.window
        print(f"| {end - args.window + 1}-{end} | {float32[:, index].mean():.4f} | {spread[index]:.4f} "
              f"| {bfloat16[:, index].mean():.4f} | {gap[index]:+.4f} | {ratio[index]:.2f} |")
    within = int((ratio <= 1).sum())
    print(f"\nthe gap is within the float32 seed spread in {within} of {len(ratio)} windows; "
          f"largest gap / spread {ratio.max():.2f}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"keras_backend": keras.backend.backend(), "window": args.window,
                       "curves": curves, "spread": spread.tolist(), "gap": gap.tolist()},
                      file, indent=2)


if __name__ == "__main__":
    main()
