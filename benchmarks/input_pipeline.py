"""Input pipeline against training: is the input ever the bottleneck?

    python benchmarks/input_pipeline.py [--data-dir multi30k]

On Multi30k (train.en / train.de) it measures, in one run:
- the time to train the shared subword vocabulary (about 8k tokens);
- the share of lines that detokenize(tokenize(line)) gives back exactly,
  listing the exceptions;
- how full and how padded the token-bucketed batches are;
- tokens per second delivered by `make_dataset` alone, and trained on by the
  tiny preset with `model.fit` on the same batches, and their ratio.
Tokens are real (non-padding) source plus target tokens.
"""

import argparse
import os
import time

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import batch_statistics
from keras_transformer.data import make_dataset
from keras_transformer.data import read_parallel_text

DEFAULT_DATA = "multi30k"  # github.com/multi30k/dataset, data/task1/raw, unzipped


def real_tokens(batch):
    inputs, labels = batch
    return int((inputs["source_ids"] != 0).sum() + (labels != 0).sum())


def pipeline_throughput(dataset):
    """Real tokens per second over one full epoch of the input pipeline."""
    start = time.perf_counter()
    tokens = sum(real_tokens((
        {"source_ids": x["source_ids"]}, y)) for x, y in dataset)
    return tokens / (time.perf_counter() - start)


class TokenTimer(keras.callbacks.Callback):
    """Times the training batches after the first (compiling) ones."""

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
        self.timed_batches = self.seen - self.skip


def training_throughput(tokenizer, dataset, steps, skip):
    """Real tokens per second trained on by the tiny preset."""
    batches = [dataset[i] for i in range(steps)]
    tokens = sum(real_tokens(b) for b in batches[skip:])
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size)
    model.compile(
        optimizer=kt.optimizers.transformer_adam(model.d_model),
        loss=kt.losses.LabelSmoothedCrossEntropy(),
    )
    # Warm up `fit` on every distinct shape first, so compiling (once per
    # shape under XLA and jax.jit) is not timed.
    shapes = {}
    for batch in batches:
        shapes.setdefault((batch[0]["source_ids"].shape, batch[1].shape), batch)
    print(f"  {len(shapes)} distinct batch shapes in {len(batches)} batches")

    def fit(batches, callbacks=()):
        model.fit(
            (batch for batch in batches),
            epochs=1,
            steps_per_epoch=len(batches),
            shuffle=False,
            callbacks=list(callbacks),
            verbose=0,
        )

    fit(list(shapes.values()))
    timer = TokenTimer(skip)
    fit(batches, [timer])
    return tokens / timer.seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--train-steps", type=int, default=60)
    args = parser.parse_args()

    corpus = read_parallel_text(
        os.path.join(args.data_dir, "train.en"), os.path.join(args.data_dir, "train.de")
    )
    print(f"backend: {keras.backend.backend()}; {corpus.summary()}")

    start = time.perf_counter()
    tokenizer = SubwordTokenizer.train(corpus, args.vocabulary_size)
    print(f"vocabulary: {tokenizer.vocabulary_size} tokens trained in "
          f"{time.perf_counter() - start:.1f}s")

    lines = corpus.texts()
    restored = tokenizer.detokenize(tokenizer.tokenize(lines))
    exceptions = [(line, back) for line, back in zip(lines, restored) if line != back]
    print(f"round trip: {1 - len(exceptions) / len(lines):.4%} of {len(lines)} lines exact")
    for line, back in exceptions[:20]:
        print(f"  {line!r} -> {back!r}")

    stats = batch_statistics(
        make_dataset(corpus, tokenizer, args.tokens_per_batch, seed=0), args.tokens_per_batch
    )
    print(
        f"batches of {args.tokens_per_batch} tokens per side: {stats['batches']} batches, "
        f"{stats['pairs']} pairs, padding {stats['padding_fraction']:.1%}, full batches fill "
        f"{stats['full_batch_fill']:.1%} of the budget "
        f"({stats['full_batches_within_10_percent']:.0%} within 10%)"
    )

    dataset = make_dataset(corpus, tokenizer, args.tokens_per_batch, seed=0)
    pipeline = pipeline_throughput(dataset)
    training = training_throughput(
        tokenizer,
        make_dataset(corpus, tokenizer, args.tokens_per_batch, seed=1, repeat=True),
        args.train_steps,
        skip=5,
    )
    print(f"input pipeline: {pipeline:,.0f} tokens/s")
    print(f"tiny model training: {training:,.0f} tokens/s")
    print(f"ratio pipeline / training: {pipeline / training:.1f}x (target >= 10x)")


if __name__ == "__main__":
    main()
