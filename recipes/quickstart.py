"""Quick start: train a tiny Transformer on the built-in corpus, translate, score.

    python recipes/quickstart.py

Needs no data: the package generates its English-German corpus (gender and
case agreement, verb-second order, verb-final clauses). The run trains a
shared subword vocabulary, trains the tiny preset with the paper's optimizer,
schedule and label smoothing on token-bucketed batches, translates the test
split greedily, and scores it with sacrebleu. It takes a few minutes on a
laptop CPU, under any backend:

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
from keras_transformer.decoding import greedy_translate


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
    os.makedirs(args.model_dir, exist_ok=True)
    model.save(os.path.join(args.model_dir, "model.keras"))
    tokenizer.save(args.model_dir)
    print(f"Saved the model and its vocabulary in {args.model_dir}")

    hypotheses = greedy_translate(
        model, tokenizer, list(test_corpus.sources), max_extra_length=10
    )
    references = list(test_corpus.targets)
    for english, german in list(zip(test_corpus.sources, hypotheses))[:3]:
        print(f"  {english}\n    -> {german}")
    metric = sacrebleu.metrics.BLEU()
    bleu = metric.corpus_score(hypotheses, [references])
    print(f"Test set, greedy decoding: {bleu}")
    print(f"sacrebleu signature: {metric.get_signature()}")
    kinds = {}
    for english, hypothesis, reference in zip(test_corpus.sources, hypotheses, references):
        kinds.setdefault(kind_of(english), []).append(hypothesis == reference)
    for kind, exact in sorted(kinds.items()):
        print(f"  exact translations, {kind}: {np.mean(exact):.1%} of {len(exact)}")


if __name__ == "__main__":
    main()
