"""Sampling the next token (keras_transformer/decoding/sampling.py): the
draws, their distribution, and sampling searches."""

import numpy as np
import pytest
from conftest import to_numpy
from keras import ops
from scipy import stats

from keras_transformer.decoding.sampling import Sampler
from keras_transformer.decoding.sampling import uniform


def numpy_uniform(seed, index, rows):
    """`uniform` in NumPy's uint32 arithmetic."""

    def mix(x):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        return x ^ (x >> np.uint32(16))

    with np.errstate(over="ignore"):
        key = mix(mix(np.uint32(index) + mix(np.uint32((seed + 0x9E3779B9) & 0xFFFFFFFF))))
        bits = mix(np.arange(rows, dtype=np.uint32) * np.uint32(0x7FEB352D) + key)
    return (bits >> np.uint32(8)).astype(np.float32) / (1 << 24)


def test_the_draws_are_the_same_on_every_backend_and_uniform():
    for seed, index in ((0, 0), (7, 3), (2**32 - 1, 40)):
        drawn = to_numpy(uniform(seed, ops.convert_to_tensor(index, "int32"), 20000))
        np.testing.assert_array_equal(drawn, numpy_uniform(seed, index, 20000))
        assert 0.0 <= drawn.min() and drawn.max() < 1.0
        assert stats.kstest(drawn, "uniform").pvalue > 0.01
    assert not np.array_equal(numpy_uniform(0, 0, 100), numpy_uniform(1, 0, 100))
    assert not np.array_equal(numpy_uniform(0, 0, 100), numpy_uniform(0, 1, 100))


def first_tokens(sampler, logits, rows=20000, index=0):
    return to_numpy(sampler(ops.convert_to_tensor(np.tile(logits, (rows, 1))), ops.convert_to_tensor(index, "int32")))


LOGITS = np.random.default_rng(0).normal(scale=2.0, size=64).astype("float32")


def test_top_k_at_a_temperature_draws_from_the_renormalized_softmax():
    drawn = first_tokens(Sampler(k=10, temperature=0.7), LOGITS)
    best = np.argsort(-LOGITS)[:10]
    assert set(np.unique(drawn)) <= set(best.tolist())
    expected = np.exp(LOGITS[best].astype("float64") / 0.7)
    counts = np.array([(drawn == token).sum() for token in best])
    assert stats.chisquare(counts, expected / expected.sum() * counts.sum()).pvalue > 0.01


def test_top_p_never_draws_outside_the_nucleus():
    probabilities = np.exp(LOGITS - LOGITS.max())
    probabilities /= probabilities.sum()
    order = np.argsort(-probabilities)
    for p in (0.3, 0.9):
        # The fewest best tokens whose probabilities reach p.
        nucleus = order[: int(np.searchsorted(np.cumsum(probabilities[order]), p)) + 1]
        drawn = first_tokens(Sampler(p=p), LOGITS, rows=5000)
        assert set(np.unique(drawn)) == set(nucleus.tolist()), p


def test_top_1_is_the_best_token_and_seeds_and_steps_draw_differently():
    assert (first_tokens(Sampler(k=1), LOGITS, rows=100) == np.argmax(LOGITS)).all()
    one, same, other = (first_tokens(Sampler(k=10, seed=seed), LOGITS, rows=200) for seed in (1, 1, 2))
    np.testing.assert_array_equal(one, same)
    assert (one != other).any()
    assert (one != first_tokens(Sampler(k=10, seed=1), LOGITS, rows=200, index=1)).any()


@pytest.mark.parametrize("sampling, message", [
    ("topk:0", r"sampling must be topk:K with an integer K >= 1 or topp:P with 0 < P <= 1. Received: sampling='topk:0'"),
    ("topp:1.5", r"Received: sampling='topp:1.5'"),
    ("top:3", r"Received: sampling='top:3'"),
])
def test_bad_sampling_settings_are_refused(sampling, message):
    from keras_transformer.decoding import SearchSettings

    with pytest.raises(ValueError, match=message):
        SearchSettings(sampling=sampling, beam_size=1)
    with pytest.raises(ValueError, match=r"temperature must be a finite number above 0. Received: temperature=0"):
        SearchSettings(sampling="topk:5", temperature=0)
    with pytest.raises(ValueError, match=r"temperature=0.5 applies to sampling"):
        SearchSettings(temperature=0.5)


def test_a_sampling_translator_draws_per_seed_and_top_1_is_greedy_search(translation_model, translation_tokenizer):
    from keras_transformer.decoding import Translator
    from translation_fixtures import SENTENCES

    greedy = Translator(translation_model, translation_tokenizer, beam_size=1, max_extra_length=8)
    top_1 = greedy.with_search(sampling="topk:1", beam_size=4)  # a sampling search draws one translation, whatever the beam
    found, expected = top_1.search(SENTENCES), greedy.search(SENTENCES)
    for i, (_, ids, scores) in expected.items():
        np.testing.assert_array_equal(found[i][1], ids)
        np.testing.assert_allclose(found[i][2], scores, rtol=1e-5)
    drawn = {seed: greedy.with_search(sampling="topp:0.95", temperature=2.0, seed=seed).translate(SENTENCES) for seed in (1, 2)}
    assert drawn[1] != drawn[2]
    assert greedy.with_search(sampling="topp:0.95", temperature=2.0, seed=1).translate(SENTENCES) == drawn[1]
