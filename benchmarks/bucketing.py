"""Token-bucketed batches against fixed-size padded batches, on Multi30k, in one run.

    python benchmarks/bucketing.py [--data-dir multi30k] [--steps 15] [--rounds 3]

The same training pairs reach the same model in two kinds of batch:

- `bucketed`: `make_dataset` (section 5.1: "batched together by approximate
  sequence length"), 4,096 padded tokens per side, each batch padded to its
  bucket's length;
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
ratio bucketed / padded. `--json` writes the figures to a file.
"""

import argparse
import json
import os
import time

import keras
import numpy as np
from fit_timing import StepTimes
from fit_timing import fit_batches
from fit_timing import one_batch_per_shape

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import make_dataset
from keras_transformer.data import read_parallel_text

DEFAULT_DATA = "multi30k"  # github.com/multi30k/dataset, data/task1/raw, unzipped
ARCHITECTURE = {"num_layers": 3, "d_model": 256, "d_ff": 1024, "num_heads": 4, "dropout": 0.1}


def bucketed_batches(corpus, tokenizer, tokens_per_batch, count):
    dataset = make_dataset(corpus, tokenizer, tokens_per_batch, repeat=True, seed=0)
    return [dataset[i] for i in range(count)]


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--json", help="where to write the figures")
    args = parser.parse_args()
    for name in ("steps", "rounds", "tokens_per_batch", "vocabulary_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")

    corpus = read_parallel_text(
        os.path.join(args.data_dir, "train.en"), os.path.join(args.data_dir, "train.de")
    )
    start = time.perf_counter()
    tokenizer = SubwordTokenizer.train(corpus, args.vocabulary_size)
    print(f"backend {keras.backend.backend()}; {corpus.summary()}; vocabulary of "
          f"{tokenizer.vocabulary_size} trained in {time.perf_counter() - start:.0f}s", flush=True)

    count = args.steps * args.rounds
    kinds = {"bucketed": bucketed_batches(corpus, tokenizer, args.tokens_per_batch, count)}
    pairs_per_batch = round(np.mean([labels.shape[0] for _, labels in kinds["bucketed"]]))
    kinds["padded"] = padded_batches(corpus, tokenizer, pairs_per_batch, count)

    padding = {kind: padding_fraction(batches) for kind, batches in kinds.items()}
    models = {}
    for kind, batches in kinds.items():
        keras.utils.set_random_seed(0)
        model = kt.build_transformer(
            "small", vocabulary_size=tokenizer.vocabulary_size, **ARCHITECTURE
        )
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
            timer = StepTimes()
            fit_batches(models[kind], chunk, [timer])
            seconds[kind] += timer.ends[-1] - timer.begin
            tokens[kind] += sum(int((labels != 0).sum()) for _, labels in chunk)
        print(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
            f"{kind} {tokens[kind] / seconds[kind]:,.0f} target tokens/s" for kind in kinds),
            flush=True)

    report = {
        "keras_backend": keras.backend.backend(),
        "tokens_per_batch": args.tokens_per_batch,
        "padded_pairs_per_batch": pairs_per_batch,
        "steps": count,
    }
    print("\n| batches | pairs per batch | padding | non-padding target tokens/s |\n"
          "| --- | ---: | ---: | ---: |")
    for kind, batches in kinds.items():
        rate = tokens[kind] / seconds[kind]
        pairs = np.mean([labels.shape[0] for _, labels in batches])
        report[kind] = {"padding_fraction": padding[kind],
                        "target_tokens_per_second": rate, "mean_pairs_per_batch": float(pairs)}
        print(f"| {kind} | {pairs:.0f} | {padding[kind]:.1%} | {rate:,.0f} |")
    report["bucketed/padded"] = (
        report["bucketed"]["target_tokens_per_second"] / report["padded"]["target_tokens_per_second"]
    )
    print(f"\nbucketed / padded: {report['bucketed/padded']:.2f}x non-padding target tokens/s")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)


if __name__ == "__main__":
    main()
