"""Quick start: train a tiny Transformer, translate with it, and score it.

    python recipes/quickstart.py

The task is synthetic (reverse a sequence of tokens), so it needs no data and
runs in about a minute on a laptop CPU, under any backend:

    KERAS_BACKEND=jax python recipes/quickstart.py
"""

import argparse
import time

import keras
import numpy as np
import sacrebleu.metrics

import keras_transformer as kt
from keras_transformer.data.synthetic import BOS_ID
from keras_transformer.data.synthetic import EOS_ID


def train(examples, epochs, vocabulary_size, seed):
    """Builds the tiny preset and fits it with the paper's optimizer and loss."""
    keras.utils.set_random_seed(seed)
    inputs, labels = kt.data.reversal_task(examples, vocabulary_size, seed=seed)
    validation = kt.data.reversal_task(500, vocabulary_size, seed=seed + 1)
    model = kt.build_transformer(
        "tiny", vocabulary_size=vocabulary_size, dropout=0.0
    )
    model.compile(
        optimizer=kt.optimizers.transformer_adam(model.d_model, warmup_steps=1000),
        loss=kt.losses.LabelSmoothedCrossEntropy(label_smoothing=0.1),
        metrics=[kt.metrics.MaskedTokenAccuracy()],
    )
    model.fit(
        inputs,
        labels,
        batch_size=64,
        epochs=epochs,
        validation_data=validation,
        verbose=2,
    )
    return model


def greedy_translate(model, source_ids, max_length):
    """Decodes one token at a time from the cache, picking the argmax."""
    encoder_output, encoder_padding_mask = model.encode(source_ids)
    cache = model.initial_cache(encoder_output, max_length)
    batch_size = source_ids.shape[0]
    tokens = np.full((batch_size, 1), BOS_ID, "int32")
    outputs = []
    for index in range(max_length):
        logits, cache = model.decode_step(
            tokens, cache, index, encoder_padding_mask
        )
        tokens = np.argmax(keras.ops.convert_to_numpy(logits), -1).astype("int32")
        outputs.append(tokens[:, 0])
    outputs = np.stack(outputs, 1)
    return [list(row[: list(row).index(EOS_ID)] if EOS_ID in row else row) for row in outputs]


def as_text(ids):
    return " ".join(str(int(i)) for i in ids)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--vocabulary-size", type=int, default=16)
    parser.add_argument("--test-examples", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"Backend: {keras.backend.backend()}")
    start = time.time()
    model = train(args.examples, args.epochs, args.vocabulary_size, args.seed)
    print(f"Trained {model.count_params():,} parameters in {time.time() - start:.0f}s")

    test_inputs, _ = kt.data.reversal_task(
        args.test_examples, args.vocabulary_size, seed=args.seed + 2
    )
    sources = [row[row != 0] for row in test_inputs["source_ids"]]
    references = [as_text(source[::-1]) for source in sources]
    hypotheses = [
        as_text(ids)
        for ids in greedy_translate(
            model, test_inputs["source_ids"], test_inputs["target_ids"].shape[1]
        )
    ]
    for source, hypothesis in list(zip(sources, hypotheses))[:3]:
        print(f"  {as_text(source):<24} -> {hypothesis}")
    metric = sacrebleu.metrics.BLEU(tokenize="none")
    bleu = metric.corpus_score(hypotheses, [references])
    exact = np.mean([h == r for h, r in zip(hypotheses, references)])
    print(f"Test set, greedy decoding: exact match {exact:.1%}, {bleu}")
    print(f"sacrebleu signature: {metric.get_signature()}")


if __name__ == "__main__":
    main()
