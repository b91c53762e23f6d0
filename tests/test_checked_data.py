"""Keras's own `evaluate` and `predict` on the package's datasets, the ones
`fit` takes: token-bucketed batches of several lengths."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.data import SubwordTokenizer, builtin_corpus, make_dataset

from conftest import to_numpy


@pytest.fixture(scope="module")
def bucketed():
    corpus = builtin_corpus("valid", size=60)
    tokenizer = SubwordTokenizer.train(builtin_corpus("train", size=300), vocabulary_size=400)
    dataset = make_dataset(corpus, tokenizer, tokens_per_batch=200, max_length=40, shuffle=False, buckets=3)
    keras.utils.set_random_seed(0)
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=400, num_layers=1, d_model=32))
    return model, dataset


def test_predict_pads_each_bucket_s_logits_to_the_longest_and_keeps_the_dataset_s_order(bucketed):
    model, dataset = bucketed
    lengths = {dataset[i][1].shape[1] for i in range(len(dataset))}
    assert len(lengths) > 1  # batches of several lengths, which Keras alone cannot concatenate
    predicted = model.predict(dataset, verbose=0)
    rows = sum(dataset[i][1].shape[0] for i in range(len(dataset)))
    assert predicted.shape == (rows, dataset.longest, 400) and dataset.longest == max(lengths)
    start = 0
    for i in range(len(dataset)):
        inputs, labels = dataset[i]
        length = labels.shape[1]
        expected = to_numpy(model(inputs))
        np.testing.assert_allclose(predicted[start : start + len(labels), :length], expected, atol=1e-5)
        assert not predicted[start : start + len(labels), length:].any()  # zeros after a batch's last position
        start += len(labels)
    # Arrays of one length come back as Keras gives them, unpadded.
    inputs, labels = dataset[0]
    assert model.predict(inputs, verbose=0).shape == (len(labels), labels.shape[1], 400)


def test_evaluate_takes_the_batches_fit_takes_and_scores_every_batch(bucketed):
    model, dataset = bucketed
    scores = model.evaluate(dataset, verbose=0, return_dict=True)
    assert set(scores) == {"loss", "masked_token_accuracy", "perplexity"}  # no bookkeeping
    # Keras's mean of the batches' losses, weighted by their rows, as one
    # batch at a time gives them.
    losses, rows = [], []
    for i in range(len(dataset)):
        inputs, labels = dataset[i]
        losses.append(model.test_on_batch(inputs, labels, return_dict=True)["loss"])
        rows.append(len(labels))
    np.testing.assert_allclose(scores["loss"], np.average(losses, weights=rows), rtol=1e-5)
