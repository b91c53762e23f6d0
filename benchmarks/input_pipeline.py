"""Input pipeline against training, and token-bucketed batches against padded ones.

    python benchmarks/input_pipeline.py [--data-dir multi30k] [--preset tiny] [--json OUT]
    KERAS_BACKEND=tensorflow python benchmarks/input_pipeline.py --bucketing [--steps 15] [--rounds 3] [--json OUT]

Is the input ever the bottleneck? On Multi30k (train.en / train.de) it
measures, in one run:
- the time to train the shared subword vocabulary (about 8k tokens);
- the share of lines that detokenize(tokenize(line)) gives back exactly,
  listing the exceptions;
- how full and how padded the token-bucketed batches are;
- tokens per second delivered by `make_dataset` alone, and trained on by
  `--preset` (tiny unless told; base for a preset's own speed on real
  batches) with `model.fit` on the same batches (after a warm-up on every
  batch shape, so that compiling is not timed), and their ratio.
Tokens are real (non-padding) source plus target tokens.

`--bucketing` compares two kinds of batch instead. The same training pairs
reach the same model as:

- `bucketed`: `make_dataset` (section 5.1: "batched together by approximate
  sequence length"), `--tokens-per-batch` padded tokens per side, each
  batch padded to its bucket's length;
- `padded`: the pairs in shuffled order, a fixed number of pairs per batch,
  each side padded to the longest sentence of its batch, as `padded_batch`
  does in most tutorials. The number of pairs is the mean of the bucketed
  batches, so both kinds carry the same real tokens per step on average.

Two copies of the Multi30k recipe's model (3+3 layers, d_model 256, the same
initial weights) train on them, taking turns in rounds of `--steps` steps so
that both see the machine's noise. Every batch shape is compiled in a
warm-up first. Batches are made ahead of time, in NumPy, so the input
pipeline is not timed. Reported: each kind's padding (the share of padded
positions, both sides), its non-padding target tokens per second, and the
ratio bucketed / padded.
"""

import argparse
import json
import os
import time

import keras
import numpy as np
from _support import fit_batches
from _support import one_batch_per_shape
from _support import step_times

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import batch_statistics
from keras_transformer.data import make_dataset
from keras_transformer.data import read_parallel_text

DEFAULT_DATA = "multi30k"  # github.com/multi30k/dataset, data/task1/raw, unzipped
RECIPE_ARCHITECTURE = {"num_layers": 3, "d_model": 256, "d_ff": 1024, "num_heads": 4, "dropout": 0.1}


def real_tokens(batch):
    inputs, labels = batch
    return int((inputs["source_ids"] != 0).sum() + (labels != 0).sum())


def pipeline_throughput(dataset):
    """Real tokens per second over one full epoch of the input pipeline."""
    start = time.perf_counter()
    tokens = sum(real_tokens(({"source_ids": x["source_ids"]}, y)) for x, y in dataset)
    return tokens / (time.perf_counter() - start)


class TokenTimer(keras.callbacks.Callback):
    """Times the training batches after the first `skip` (compiling) ones."""

    def __init__(self, skip):
        super().__init__()
        self.skip, self.seen, self.start = skip, 0, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.seen == self.skip:
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.start


def training_throughput(preset, tokenizer, dataset, steps, skip=5):
    """Real tokens per second trained on by `preset` over `steps` batches of
    `dataset`, the first `skip` untimed."""
    batches = [dataset[i] for i in range(steps)]
    tokens = sum(real_tokens(b) for b in batches[skip:])
    model = kt.build_transformer(preset, vocabulary_size=tokenizer.vocabulary_size)
    model.compile(
        optimizer=kt.optimizers.transformer_adam(model.d_model),
        loss=kt.losses.LabelSmoothedCrossEntropy(),
    )
    # Warm up `fit` on every distinct shape first, so compiling (once per
    # shape under XLA and jax.jit) is not timed.
    warmup = one_batch_per_shape(batches)
    print(f"  {len(warmup)} distinct batch shapes in {len(batches)} batches")

    def fit(batches, callbacks=()):
        model.fit((batch for batch in batches), epochs=1, steps_per_epoch=len(batches), shuffle=False,
                  callbacks=list(callbacks), verbose=0)

    fit(warmup)
    timer = TokenTimer(skip)
    fit(batches, [timer])
    return tokens / timer.seconds


def pipeline_report(args, corpus):
    start = time.perf_counter()
    tokenizer = SubwordTokenizer.train(corpus, args.vocabulary_size)
    report = {"vocabulary_seconds": time.perf_counter() - start, "vocabulary_size": tokenizer.vocabulary_size}
    print(f"vocabulary: {tokenizer.vocabulary_size} tokens trained in {report['vocabulary_seconds']:.1f}s")

    lines = corpus.texts()
    restored = tokenizer.detokenize(tokenizer.tokenize(lines))
    exceptions = [(line, back) for line, back in zip(lines, restored) if line != back]
    report["round_trip_exact"] = 1 - len(exceptions) / len(lines)
    print(f"round trip: {report['round_trip_exact']:.4%} of {len(lines)} lines exact")
    for line, back in exceptions[:20]:
        print(f"  {line!r} -> {back!r}")

    stats = batch_statistics(make_dataset(corpus, tokenizer, args.tokens_per_batch, seed=0), args.tokens_per_batch)
    report["batches"] = stats
    print(
        f"batches of {args.tokens_per_batch} tokens per side: {stats['batches']} batches, "
        f"{stats['pairs']} pairs, padding {stats['padding_fraction']:.1%}, full batches fill "
        f"{stats['full_batch_fill']:.1%} of the budget "
        f"({stats['full_batches_within_10_percent']:.0%} within 10%)"
    )

    report["pipeline_tokens_per_second"] = pipeline_throughput(
        make_dataset(corpus, tokenizer, args.tokens_per_batch, seed=0)
    )
    report["training_tokens_per_second"] = training_throughput(
        args.preset, tokenizer, make_dataset(corpus, tokenizer, args.tokens_per_batch, seed=1, repeat=True),
        args.train_steps,
    )
    report["pipeline/training"] = report["pipeline_tokens_per_second"] / report["training_tokens_per_second"]
    print(f"input pipeline: {report['pipeline_tokens_per_second']:,.0f} tokens/s")
    print(f"{args.preset} model training: {report['training_tokens_per_second']:,.0f} tokens/s")
    print(f"ratio pipeline / training: {report['pipeline/training']:.1f}x (target >= 10x)")
    return report


# --bucketing -----------------------------------------------------------------


def padded_batches(corpus, tokenizer, pairs_per_batch, count, seed=0):
    """Fixed-size batches of shuffled pairs, each padded to its longest sentence."""
    sources, targets = zip(*corpus)
    source_ids = tokenizer.tokenize(list(sources))
    target_ids = tokenizer.tokenize(list(targets))
    order = np.random.default_rng(seed).permutation(len(source_ids))

    def pad(rows):
        longest = max(len(row) for row in rows)
        return np.array([row + [0] * (longest - len(row)) for row in rows], dtype="int32")

    batches = []
    for start in range(0, count * pairs_per_batch, pairs_per_batch):
        chosen = [order[i % len(order)] for i in range(start, start + pairs_per_batch)]
        batches.append((
            {
                "source_ids": pad([source_ids[i] + [tokenizer.eos_id] for i in chosen]),
                "target_ids": pad([[tokenizer.bos_id] + target_ids[i] for i in chosen]),
            },
            pad([target_ids[i] + [tokenizer.eos_id] for i in chosen]),
        ))
    return batches


def padding_fraction(batches):
    padded = real = 0
    for inputs, labels in batches:
        for side in (inputs["source_ids"], labels):
            padded += side.size
            real += int((side != 0).sum())
    return 1 - real / padded


def bucketing_report(args, corpus):
    start = time.perf_counter()
    tokenizer = SubwordTokenizer.train(corpus, args.vocabulary_size)
    print(f"vocabulary of {tokenizer.vocabulary_size} trained in {time.perf_counter() - start:.0f}s", flush=True)

    count = args.steps * args.rounds
    dataset = make_dataset(corpus, tokenizer, args.tokens_per_batch, repeat=True, seed=0)
    kinds = {"bucketed": [dataset[i] for i in range(count)]}
    pairs_per_batch = round(np.mean([labels.shape[0] for _, labels in kinds["bucketed"]]))
    kinds["padded"] = padded_batches(corpus, tokenizer, pairs_per_batch, count)

    padding = {kind: padding_fraction(batches) for kind, batches in kinds.items()}
    models = {}
    for kind, batches in kinds.items():
        keras.utils.set_random_seed(0)
        model = kt.build_transformer("small", vocabulary_size=tokenizer.vocabulary_size, **RECIPE_ARCHITECTURE)
        kt.training.compile_model(model, warmup_steps=4000)
        warmup = one_batch_per_shape(batches)
        start = time.perf_counter()
        fit_batches(model, warmup)
        print(f"{kind}: {len(warmup)} batch shapes, warm-up {time.perf_counter() - start:.0f}s, "
              f"padding {padding[kind]:.1%}", flush=True)
        models[kind] = model

    seconds = {kind: 0.0 for kind in kinds}
    tokens = {kind: 0 for kind in kinds}
    for round_index in range(args.rounds):
        order = list(kinds) if round_index % 2 == 0 else list(reversed(kinds))
        for kind in order:
            chunk = kinds[kind][round_index * args.steps:(round_index + 1) * args.steps]
            timer = step_times()
            fit_batches(models[kind], chunk, [timer])
            seconds[kind] += timer.ends[-1] - timer.begin
            tokens[kind] += sum(int((labels != 0).sum()) for _, labels in chunk)
        print(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
            f"{kind} {tokens[kind] / seconds[kind]:,.0f} target tokens/s" for kind in kinds), flush=True)

    report = {"tokens_per_batch": args.tokens_per_batch, "padded_pairs_per_batch": pairs_per_batch, "steps": count}
    print("\n| batches | pairs per batch | padding | non-padding target tokens/s |\n| --- | ---: | ---: | ---: |")
    for kind, batches in kinds.items():
        rate = tokens[kind] / seconds[kind]
        pairs = np.mean([labels.shape[0] for _, labels in batches])
        report[kind] = {"padding_fraction": padding[kind], "target_tokens_per_second": rate,
                        "mean_pairs_per_batch": float(pairs)}
        print(f"| {kind} | {pairs:.0f} | {padding[kind]:.1%} | {rate:,.0f} |")
    report["bucketed/padded"] = (
        report["bucketed"]["target_tokens_per_second"] / report["padded"]["target_tokens_per_second"]
    )
    print(f"\nbucketed / padded: {report['bucketed/padded']:.2f}x non-padding target tokens/s")
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA, help="holds train.en and train.de")
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--preset", default="tiny", choices=sorted(kt.models.PRESETS),
                        help="the model whose training the pipeline is set against")
    parser.add_argument("--train-steps", type=int, default=60, help="batches it trains on, the first 5 untimed")
    parser.add_argument("--bucketing", action="store_true", help="bucketed against padded batches instead")
    parser.add_argument("--steps", type=int, default=15, help="with --bucketing: timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="with --bucketing")
    parser.add_argument("--json", help="where to write the figures")
    args = parser.parse_args()
    for name in ("steps", "rounds", "tokens_per_batch", "vocabulary_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1. Received: {getattr(args, name)}")
    if args.train_steps <= 5:
        parser.error(f"--train-steps must exceed the 5 untimed ones. Received: {args.train_steps}")

    corpus = read_parallel_text(os.path.join(args.data_dir, "train.en"), os.path.join(args.data_dir, "train.de"))
    print(f"backend: {keras.backend.backend()}; {corpus.summary()}")
    report = bucketing_report(args, corpus) if args.bucketing else pipeline_report(args, corpus)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"keras_backend": keras.backend.backend(), **report}, file, indent=2)


if __name__ == "__main__":
    main()
