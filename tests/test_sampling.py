"""Subword regularization (`--subword-alpha`): each training sentence
segmented anew at random, the text and the batches' shapes unchanged, the
draws the same for the same batch."""

import numpy as np
import pytest

from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import TokenBatches
from keras_transformer.data import builtin_corpus
from keras_transformer.data.prepared import tokenize_pairs
from keras_transformer.data.sampling import SubwordSampling

from conftest import in_one_pass

pytestmark = in_one_pass("torch", "SentencePiece and NumPy, the same under every backend")


@pytest.fixture(scope="module")
def corpus():
    return builtin_corpus("train", size=300, seed=5)


@pytest.fixture(scope="module")
def data(corpus):
    tokenizer = SubwordTokenizer.train(corpus, vocabulary_size=600)
    sources, targets = zip(*corpus)
    return tokenizer, tokenize_pairs(sources, targets, tokenizer)


def batches(data, alpha=None, **options):
    tokenizer, pairs = data
    sampling = None if alpha is None else SubwordSampling(tokenizer, alpha)
    return TokenBatches(pairs, 512, max_length=64, repeat=True, seed=2, sampling=sampling, **options)


def rows(tokenizer, ids):
    return [tokenizer.detokenize(row) for row in ids]


def test_sampled_batches_hold_the_same_text_in_other_segmentations(data, corpus):
    tokenizer, _ = data
    plain, sampled = batches(data), batches(data, alpha=0.1)
    assert set(sampled.lengths) == set(plain.lengths)  # the same shapes to compile
    changed = total = 0
    for step in range(8):
        inputs, labels = sampled[step]
        members = sampled.pair_indices(step)[0]
        sources, targets = [corpus[i][0] for i in members], [corpus[i][1] for i in members]
        assert rows(tokenizer, inputs["source_ids"]) == sources
        assert rows(tokenizer, inputs["target_ids"]) == targets == rows(tokenizer, labels)
        # The decoder reads the labels shifted right, BOS first.
        np.testing.assert_array_equal(inputs["target_ids"][:, 1:], np.where(labels[:, :-1] == tokenizer.eos_id, 0, labels[:, :-1]))
        assert labels.size <= 512 and labels.shape[1] in plain.lengths
        own = tokenizer.tokenize(targets)
        changed += sum(list(row[: len(ids)]) != ids for row, ids in zip(labels.tolist(), own))
        total += len(own)
    assert changed > total // 3, (changed, total)  # at alpha 0.1 most sentences have a merge left out


def test_the_same_batch_draws_the_same_segmentations_and_another_batch_others(data):
    first, again = batches(data, alpha=0.1), batches(data, alpha=0.1)
    for step in (0, 3):
        np.testing.assert_array_equal(first[step][1], again[step][1])
    # An endless stream's second epoch holds the same pairs, drawn anew.
    epoch = first.batches_per_epoch
    same_pairs = [s for s in range(epoch) if sorted(first.pair_indices(s)[0]) == sorted(first.pair_indices(epoch + s)[0])]
    if same_pairs:
        step = same_pairs[0]
        assert not np.array_equal(first[step][1], first[epoch + step][1])
    assert first.starting_at(3)[0][1].tolist() == first[3][1].tolist()  # what a resume sees


def test_bad_alphas_and_tokenizers_without_sampling_are_refused(data):
    tokenizer, _ = data
    for alpha in (0, -0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="`alpha` must be a number in"):
            SubwordSampling(tokenizer, alpha)
    with pytest.raises(ValueError, match="draws SentencePiece segmentations; object has none"):
        SubwordSampling(object(), 0.1)
