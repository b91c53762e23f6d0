"""Quick start: train a tiny Transformer on the built-in corpus, translate, score.

    python recipes/quickstart.py

Needs no data: the package generates its English-German corpus (gender and
case agreement, verb-second order, verb-final clauses). The run trains a
shared subword vocabulary, trains the tiny preset with the paper's optimizer,
schedule and label smoothing on token-bucketed batches, translates the test
split with greedy search and with the paper's beam search (beam 4, length
penalty 0.6), and scores both with sacrebleu. The trained translator is saved
for the command line, and for TF Serving:

    python -m keras_transformer translate --model-dir runs/quickstart < input.en
    python -m keras_transformer export --model-dir runs/quickstart   # saved_models/quickstart/<version>/

It takes a few minutes on a laptop CPU, under any backend:

    KERAS_BACKEND=jax python recipes/quickstart.py
"""

import argparse
import os
import time

import keras
import numpy as np
import sacrebleu.metrics

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import builtin_corpus
from keras_transformer.data import make_dataset
from keras_transformer.data.builtin import ADVERBS
from keras_transformer.data.builtin import SUBORDINATORS
from keras_transformer.decoding import Translator


def train(train_corpus, valid_corpus, tokenizer, epochs, tokens_per_batch):
    """Builds the tiny preset and fits it with the paper's optimizer and loss."""
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size)
    model.compile(
        optimizer=kt.optimizers.transformer_adam(model.d_model, warmup_steps=400),
        loss=kt.losses.LabelSmoothedCrossEntropy(label_smoothing=0.1),
        metrics=[kt.metrics.MaskedTokenAccuracy()],
    )
    history = model.fit(
        make_dataset(train_corpus, tokenizer, tokens_per_batch, seed=0),
        validation_data=make_dataset(
            valid_corpus, tokenizer, tokens_per_batch, shuffle=False
        ),
        epochs=epochs,
        verbose=2,
    )
    return model, history


def kind_of(english):
    """Which word order the German side needs."""
    first = english.split()[0].lower()
    if first in ADVERBS:
        return "fronted adverb (verb second)"
    if first in SUBORDINATORS or any(f" {s} " in english for s in SUBORDINATORS):
        return "subordinate clause (verb last)"
    return "plain (subject-verb-object)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=20000)
    parser.add_argument("--valid-size", type=int, default=500)
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--tokens-per-batch", type=int, default=2048)
    parser.add_argument("--vocabulary-size", type=int, default=800)
    parser.add_argument("--model-dir", default=os.path.join("runs", "quickstart"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    keras.utils.set_random_seed(args.seed)
    print(f"Backend: {keras.backend.backend()}")
    start = time.time()
    train_corpus = builtin_corpus("train", size=args.train_size, seed=args.seed)
    valid_corpus = builtin_corpus("valid", size=args.valid_size, seed=args.seed)
    test_corpus = builtin_corpus("test", size=args.test_size, seed=args.seed)
    print(f"Built-in corpus: {len(train_corpus)} train, {len(valid_corpus)} valid, {len(test_corpus)} test pairs")
    for english, german in train_corpus[:2]:
        print(f"  {english}  ->  {german}")

    tokenizer = SubwordTokenizer.train(train_corpus, args.vocabulary_size)
    print(f"Shared subword vocabulary: {tokenizer.vocabulary_size} tokens")
    model, history = train(
        train_corpus, valid_corpus, tokenizer, args.epochs, args.tokens_per_batch
    )
    accuracy = history.history["val_masked_token_accuracy"][-1]
    print(f"Trained {model.count_params():,} parameters in {time.time() - start:.0f}s; "
          f"validation token accuracy {accuracy:.1%}")
    translator = Translator(model, tokenizer, beam_size=4, alpha=0.6)
    translator.save(args.model_dir)
    print(f"Saved the translator (model, vocabulary, search settings) in {args.model_dir}; use it with")
    print(f"  python -m keras_transformer translate --model-dir {args.model_dir} < input.en")
    print(f"  python -m keras_transformer export --model-dir {args.model_dir}   # a SavedModel for TF Serving")

    sources, references = list(test_corpus.sources), list(test_corpus.targets)
    for beam_size in (1, 4):
        search = Translator(model, tokenizer, beam_size=beam_size, alpha=0.6)
        start = time.time()
        hypotheses = search.translate(sources)
        name = "greedy search" if beam_size == 1 else "beam search (beam 4, alpha 0.6)"
        print(f"Test set, {name}, {len(sources)} sentences in {time.time() - start:.1f}s:")
        for metric in (sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()):
            print(f"  {metric.corpus_score(hypotheses, [references])}  ({metric.get_signature()})")
    for english, german in list(zip(sources, hypotheses))[:3]:
        print(f"  {english}\n    -> {german}")
    kinds = {}
    for english, hypothesis, reference in zip(sources, hypotheses, references):
        kinds.setdefault(kind_of(english), []).append(hypothesis == reference)
    for kind, exact in sorted(kinds.items()):
        print(f"  exact translations (beam 4), {kind}: {np.mean(exact):.1%} of {len(exact)}")


if __name__ == "__main__":
    main()
