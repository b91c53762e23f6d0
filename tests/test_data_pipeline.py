import itertools
import os

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import batch_statistics
from keras_transformer.data import builtin_corpus
from keras_transformer.data import make_dataset
from keras_transformer.data import read_parallel_text
from keras_transformer.data.pipeline import bucket_lengths

from conftest import MULTI30K, needs_multi30k


@pytest.fixture(scope="module")
def corpus():
    return builtin_corpus("train", size=2000, seed=1)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return SubwordTokenizer.train(corpus, vocabulary_size=500)


def batches(dataset, count=None):
    return [(x["source_ids"], x["target_ids"], y) for x, y in itertools.islice(dataset, count)]


def real_rows(source_ids, target_ids, labels):
    """The rows that hold a pair; the rest fill a bucket's last batch."""
    real = (labels != 0).any(1)
    assert not (source_ids[~real] != 0).any() and not (target_ids[~real] != 0).any()
    return source_ids[real], target_ids[real], labels[real]


def test_every_pair_arrives_once_with_bos_eos_and_shifted_targets(corpus, tokenizer):
    seen_sources, seen_targets = [], []
    for batch in batches(make_dataset(corpus, tokenizer, 1024, seed=0)):
        source_ids, target_ids, labels = real_rows(*batch)
        assert source_ids.dtype == target_ids.dtype == labels.dtype == np.int32
        assert target_ids.shape == labels.shape
        assert (target_ids[:, 0] == tokenizer.bos_id).all()
        real = labels != 0
        # The decoder input is the labels shifted right by one.
        next_real = real[:, 1:]
        np.testing.assert_array_equal(target_ids[:, 1:][next_real], labels[:, :-1][next_real])
        assert ((target_ids != 0) == real).all()
        lengths = real.sum(1)
        assert (labels[np.arange(len(labels)), lengths - 1] == tokenizer.eos_id).all()
        source_lengths = (source_ids != 0).sum(1)
        assert (source_ids[np.arange(len(source_ids)), source_lengths - 1] == tokenizer.eos_id).all()
        seen_sources += tokenizer.detokenize(source_ids)
        seen_targets += tokenizer.detokenize(labels)
    assert sorted(zip(seen_sources, seen_targets)) == sorted(corpus)


def test_batches_hold_the_token_budget(corpus, tokenizer):
    budget = 600
    sizes = []
    for source_ids, target_ids, _ in batches(make_dataset(corpus, tokenizer, budget, repeat=True), 40):
        padded = max(source_ids.size, target_ids.size)
        assert padded <= budget
        sizes.append(padded)
    # With `repeat`, every batch is full: within 10% of the budget.
    assert min(sizes) >= 0.9 * budget
    stats = batch_statistics(make_dataset(corpus, tokenizer, budget, seed=0), budget)
    assert stats["pairs"] == len(corpus)
    assert stats["full_batches_within_10_percent"] == 1.0
    # 2,000 pairs spread over ~20 buckets: the rows that fill up each
    # bucket's last batch are a large share here (about 5% on Multi30k).
    assert 0.0 < stats["padding_fraction"] < 0.25


def test_each_bucket_has_one_shape_and_the_epoch_its_batch_count(corpus, tokenizer):
    for step in (1.1, 1.3):
        lengths = set(bucket_lengths(256, step=step))
        dataset = make_dataset(corpus, tokenizer, 1024, seed=0, bucket_step=step)
        shapes = {}
        for source_ids, target_ids, labels in batches(dataset):
            assert source_ids.shape == target_ids.shape == labels.shape
            assert source_ids.shape[1] in lengths
            shapes.setdefault(source_ids.shape[1], set()).add(source_ids.shape)
        # The last batch of a bucket is filled up to the full batch's rows.
        assert all(len(s) == 1 for s in shapes.values()), shapes
        assert len(dataset) == sum(1 for _ in dataset)
    assert len(bucket_lengths(256, step=1.3)) < len(bucket_lengths(256, step=1.1))


def test_padding_rows_change_neither_loss_nor_metrics(corpus, tokenizer):
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1)
    loss = kt.losses.LabelSmoothedCrossEntropy(0.1)
    source_ids, target_ids, labels = next(
        b for b in batches(make_dataset(corpus, tokenizer, 1024, seed=0)) if not (b[2] != 0).any(1).all()
    )
    real = (labels != 0).any(1)
    padded = model({"source_ids": source_ids, "target_ids": target_ids})
    alone = model({"source_ids": source_ids[real], "target_ids": target_ids[real]})
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loss(labels, padded)),
        keras.ops.convert_to_numpy(loss(labels[real], alone)), rtol=1e-5,
    )
    accuracy = [kt.metrics.MaskedTokenAccuracy() for _ in range(2)]
    accuracy[0].update_state(labels, padded)
    accuracy[1].update_state(labels[real], alone)
    np.testing.assert_allclose(float(accuracy[0].result()), float(accuracy[1].result()), rtol=1e-6)


def test_long_pairs_are_left_out_and_counted(corpus, tokenizer):
    with pytest.warns(UserWarning, match=r"leaves out \d+ of 2000 pairs .* max_length=12"):
        dataset = make_dataset(corpus, tokenizer, 1024, max_length=12)
    stats = batch_statistics(dataset, 1024)
    assert 0 < stats["pairs"] < len(corpus)
    with pytest.raises(ValueError, match="Every pair is longer than max_length=3"):
        make_dataset(corpus, tokenizer, 1024, max_length=3, repeat=True)
    for source_ids, target_ids, _ in batches(dataset):
        assert source_ids.shape[1] <= 12 and target_ids.shape[1] <= 12


def test_shuffling_is_seeded_and_changes_each_epoch(corpus, tokenizer):
    def first_batch(dataset):
        return next(iter(dataset))[0]["source_ids"]

    assert np.array_equal(
        first_batch(make_dataset(corpus, tokenizer, 512, seed=3)),
        first_batch(make_dataset(corpus, tokenizer, 512, seed=3)),
    )
    dataset = make_dataset(corpus, tokenizer, 512, seed=3)
    epochs = [first_batch(dataset)]
    dataset.on_epoch_end()  # as model.fit calls it
    epochs.append(first_batch(dataset))
    assert epochs[0].shape != epochs[1].shape or not np.array_equal(*epochs)
    ordered = [b[0] for b in batches(make_dataset(corpus, tokenizer, 512, shuffle=False))]
    again = [b[0] for b in batches(make_dataset(corpus, tokenizer, 512, shuffle=False))]
    assert all(np.array_equal(a, b) for a, b in zip(ordered, again))


@pytest.mark.filterwarnings("ignore:Batching leaves out")
def test_a_seeded_endless_stream_is_the_same_for_every_iterator(corpus, tokenizer):
    """Resuming a run re-creates the batches; they must not change."""
    dataset = make_dataset(corpus, tokenizer, 512, repeat=True, seed=5, max_length=32)
    per_epoch = dataset.batches_per_epoch

    def first(count, dataset=dataset):
        return [x["source_ids"] for x, _ in itertools.islice(dataset, count)]

    reference = first(per_epoch + 12)
    rebuilt = make_dataset(corpus, tokenizer, 512, repeat=True, seed=5, max_length=32)
    assert all(np.array_equal(a, b) for a, b in zip(reference, first(per_epoch + 12, rebuilt)))
    # Batch k is computed, not replayed: a resumed stream starts anywhere.
    for skip in (8, per_epoch - 2, per_epoch + 3):
        resumed = first(4, dataset.starting_at(skip))
        assert all(np.array_equal(a, b) for a, b in zip(reference[skip:], resumed))
    # Passes over the data are shuffled differently.
    second_pass = reference[per_epoch:]
    assert not all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(reference, second_pass))
    other = first(12, make_dataset(corpus, tokenizer, 512, repeat=True, seed=6, max_length=32))
    assert not all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(reference, other))


def test_bad_arguments_are_reported(corpus, tokenizer):
    with pytest.raises(ValueError, match="Received: 0 pairs"):
        make_dataset(corpus[:0], tokenizer, 1024)
    with pytest.raises(ValueError, match="tokens_per_batch=100, max_length=256"):
        make_dataset(corpus, tokenizer, 100)
    for step in (0.5, float("nan"), "1.2"):
        with pytest.raises(ValueError, match="bucket_step"):
            make_dataset(corpus, tokenizer, 1024, bucket_step=step)
    for name, value, least in (
        ("tokens_per_batch", float("nan"), 1),
        ("tokens_per_batch", 1024.5, 1),
        ("max_length", 0, 2),  # was a ZeroDivisionError
        ("max_length", True, 2),
        ("batch_multiple", 0, 1),
    ):
        arguments = {"tokens_per_batch": 1024, name: value}
        with pytest.raises(ValueError, match=rf"`{name}` must be an integer >= {least}. Received: {name}={value!r}"):
            make_dataset(corpus, tokenizer, **arguments)


@pytest.mark.filterwarnings("ignore:Batching leaves out")
def test_feeds_model_fit(corpus, tokenizer):
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1)
    model.compile(
        optimizer=kt.optimizers.transformer_adam(64, warmup_steps=4),
        loss=kt.losses.LabelSmoothedCrossEntropy(),
        metrics=[kt.metrics.MaskedTokenAccuracy()],
    )
    # Three batch lengths (8, 16, 24): few programs for XLA to compile.
    dataset = make_dataset(corpus, tokenizer, 1024, max_length=24, repeat=True, seed=0, bucket_step=2)
    history = model.fit(dataset, epochs=2, steps_per_epoch=5, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[1] < losses[0]


@needs_multi30k
def test_multi30k_batches_are_full_and_little_padded():
    corpus = read_parallel_text(os.path.join(MULTI30K, "train.en"), os.path.join(MULTI30K, "train.de"))
    tokenizer = SubwordTokenizer.train(corpus, vocabulary_size=8000)
    stats = batch_statistics(make_dataset(corpus, tokenizer, 4096, seed=0), 4096)
    assert stats["pairs"] == len(corpus) == 29000
    assert stats["padding_fraction"] < 0.15
    assert stats["full_batches_within_10_percent"] == 1.0


@pytest.mark.filterwarnings("ignore:Batching leaves out")
@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="tests the TensorFlow backend's conversion of batches to tf.data (Keras's TensorFlow adapter fixes "
    "the shapes it samples); JAX and torch take the PyDataset as it is, and train every bucket shape in the "
    "quick start's test",
)
def test_fit_and_evaluate_take_every_bucket_shape(corpus, tokenizer):
    """Here the first two batches share a shape and the ones after differ:
    Keras's TensorFlow adapter fixed the shape its first two batches had."""
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1)
    kt.training.compile_model(model, warmup_steps=4)
    dataset = make_dataset(corpus[:300], tokenizer, 64, max_length=32, shuffle=False).starting_at(1)
    shapes = [x["source_ids"].shape for x, _ in dataset]
    assert len(shapes) == len(dataset)
    assert shapes[0] == shapes[1] and len(set(shapes)) > 2
    history = model.fit(dataset, epochs=1, verbose=0, shuffle=False, validation_data=dataset)
    assert np.isfinite(history.history["val_loss"]).all()
    assert np.isfinite(model.evaluate(dataset, verbose=0)).all()
