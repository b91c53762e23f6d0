"""Logits processors in the searches (keras_transformer/decoding/processors.py),
against hand-made scoring functions whose best outputs are known."""

import numpy as np
from conftest import in_one_pass
from conftest import to_numpy
from keras import ops

from keras_transformer.decoding import beam_search
from keras_transformer.decoding import greedy_search
from keras_transformer.decoding.processors import MinLength
from keras_transformer.decoding.processors import NoRepeatNgram
from keras_transformer.decoding.processors import RepetitionPenalty

# The searches' logic over hand-made scores, run eagerly; each backend's
# compiled search with processors is checked against transformers in
# test_convert_marian.py.
pytestmark = in_one_pass("torch", "the searches' logic on hand-made scores")

BOS, EOS, A, B, C = 1, 2, 3, 4, 5
V = 6
# From BOS, EOS is likeliest; A, then B, is the likeliest way to go on.
TABLE = {BOS: {EOS: 0.6, A: 0.3}, A: {EOS: 0.8, B: 0.15}, B: {EOS: 0.9}}


def log_probs(rows=None):
    table = np.zeros((V, V), "float32")
    for last in range(V):
        named = (rows or TABLE).get(last, {EOS: 0.99})
        probs = np.full(V, (1.0 - sum(named.values())) / (V - len(named)))
        for token, p in named.items():
            probs[token] = p
        table[last] = np.log(probs)
    return table


def markov(rows=None):
    """A step function whose scores are `rows`' log-probabilities of the
    next token given the last."""
    table = ops.convert_to_tensor(log_probs(rows))

    def step_fn(ids, index, state):
        last = ops.slice(ids, [0, index], [ops.shape(ids)[0], 1])[:, 0]
        return ops.take(table, last, axis=0), state

    return step_fn


def search(beam_size, processors, rows=None):
    initial = (markov(rows), np.full((1,), BOS, "int32"), ops.zeros((1, 1)))
    if beam_size == 1:
        ids, scores = greedy_search(*initial, max_length=6, eos_id=EOS, processors=processors)
        return to_numpy(ids)[0], float(to_numpy(scores)[0])
    ids, scores = beam_search(*initial, beam_size=beam_size, alpha=0.0, max_length=6, eos_id=EOS, processors=processors)
    return to_numpy(ids)[0, 0], float(to_numpy(scores)[0, 0])


def test_min_length_holds_back_eos_until_the_output_is_long_enough():
    table = log_probs()
    a_b_eos = table[BOS, A] + table[A, B] + table[B, EOS]
    for beam_size in (1, 3):
        ids, score = search(beam_size, ())
        assert ids[0] == EOS, beam_size
        ids, score = search(beam_size, (MinLength(3, EOS),))
        assert ids[:3].tolist() == [A, B, EOS], (beam_size, ids)
        # EOS held back costs no other token any probability.
        np.testing.assert_allclose(score, a_b_eos, rtol=1e-6)
        ids, _ = search(beam_size, (MinLength(2, EOS),))
        assert ids[:2].tolist() == [A, EOS], (beam_size, ids)


def test_no_repeat_ngram_bans_the_token_that_would_repeat_an_ngram():
    # A and B follow each other; C is the way out, then EOS.
    cycle = {BOS: {A: 0.9}, A: {B: 0.7, C: 0.2}, B: {A: 0.9, C: 0.05}, C: {EOS: 0.9}}
    assert search(1, (), cycle)[0].tolist() == [A, B, A, B, A, B]
    # After A B A, B would make "A B" again; after A B A B, A would make "A B A" again.
    assert search(1, (NoRepeatNgram(2, BOS),), cycle)[0][:5].tolist() == [A, B, A, C, EOS]
    assert search(1, (NoRepeatNgram(3, BOS),), cycle)[0].tolist() == [A, B, A, B, C, EOS]
    # The beam's best, A B A C EOS being less likely than A C EOS.
    assert search(3, (NoRepeatNgram(2, BOS),), cycle)[0][:3].tolist() == [A, C, EOS]


def test_the_repetition_penalty_makes_a_held_token_less_likely():
    again = {BOS: {A: 0.5, B: 0.4}, A: {A: 0.5, EOS: 0.3}}
    assert search(1, (), again)[0][:3].tolist() == [A, A, A]
    # log 0.5 x 2 falls below log 0.3: EOS.
    assert search(1, (RepetitionPenalty(2.0, BOS),), again)[0][:3].tolist() == [A, EOS, 0]
    assert search(1, (RepetitionPenalty(1.3, BOS),), again)[0][:3].tolist() == [A, A, A]
