"""Beam and greedy search against hand-made scoring functions whose best
sequences are known by enumeration."""

import itertools

import keras
import numpy as np
import pytest
from conftest import in_one_pass
from conftest import to_numpy
from keras import ops

from keras_transformer.decoding import beam_search
from keras_transformer.decoding import greedy_search
from keras_transformer.decoding.beam_search import length_penalty
from keras_transformer.decoding.selection import top_k

# The search's logic over hand-made scores, run eagerly; each backend's
# compiled search over a model is checked in test_compiled.py and test_steps.py.
pytestmark = in_one_pass("torch", "the search's logic on hand-made scores; each backend's compiled search is tested in test_compiled.py")

BOS, EOS = 1, 2
A, B, C, D = 3, 4, 5, 6
V = 7


def markov_table(rows):
    """Log-probabilities of the next token given the last one; tokens a row
    does not name share what is left of its probability."""
    table = np.zeros((V, V), "float32")
    for last in range(V):
        named = rows.get(last, {EOS: 0.99})
        rest = (1.0 - sum(named.values())) / (V - len(named))
        probs = np.full(V, rest)
        for token, p in named.items():
            probs[token] = p
        table[last] = np.log(probs)
    return table


def markov_step(table):
    """A step function reading the last token from `ids`; no state."""
    table = ops.convert_to_tensor(table)

    def step_fn(ids, index, state):
        last = ops.slice(ids, [0, index], [ops.shape(ids)[0], 1])[:, 0]
        return ops.take(table, last, axis=0), state

    return step_fn


def dummy_state(batch):
    return ops.zeros((batch, 1))


def enumerate_hypotheses(table, max_length, alpha):
    """Exhaustive search: every sequence that ends in EOS within
    `max_length` tokens, scored log P / lp, best first."""
    hypotheses = []
    for length in range(1, max_length + 1):
        for prefix in itertools.product([t for t in range(V) if t != EOS], repeat=length - 1):
            sequence = (BOS,) + prefix + (EOS,)
            log_prob = sum(table[a, b] for a, b in zip(sequence, sequence[1:]))
            hypotheses.append((log_prob / ((5 + length) / 6) ** alpha, list(sequence[1:])))
    hypotheses.sort(key=lambda pair: -pair[0])
    return [(hypothesis, score) for score, hypothesis in hypotheses]


def enumerate_best(table, max_length, alpha):
    return enumerate_hypotheses(table, max_length, alpha)[0]


def decoded(ids):
    """Tokens up to and including the first EOS."""
    ids = list(ids)
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def search(table, beam_size, alpha, max_length, batch=1):
    ids, scores = beam_search(
        markov_step(table),
        ops.full((batch,), BOS, dtype="int32"),
        dummy_state(batch),
        beam_size=beam_size,
        alpha=alpha,
        max_length=max_length,
        eos_id=EOS,
    )
    return to_numpy(ids), to_numpy(scores)


# Short "a EOS" has probability 0.6 * 0.6 = 0.36; long "b c d EOS" has
# 0.4 * 0.95^3 = 0.343. Without a length penalty the short one wins; with
# alpha = 0.6 the long one does. Greedy takes "a" and cannot find "b".
LENGTH_PENALTY_TABLE = markov_table(
    {
        BOS: {A: 0.6, B: 0.4 - 1e-4},
        A: {EOS: 0.6, C: 0.2},
        B: {C: 0.95},
        C: {D: 0.95},
        D: {EOS: 0.95},
    }
)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_finds_the_known_best_and_length_penalty_changes_it(alpha):
    best, best_score = enumerate_best(LENGTH_PENALTY_TABLE, max_length=5, alpha=alpha)
    assert best == ([A, EOS] if alpha == 0.0 else [B, C, D, EOS])  # the premise
    ids, scores = search(LENGTH_PENALTY_TABLE, beam_size=4, alpha=alpha, max_length=5)
    assert decoded(ids[0, 0]) == best
    np.testing.assert_allclose(scores[0, 0], best_score, rtol=1e-5)


def test_beam_search_beats_greedy_where_greedy_commits_too_early():
    # "a" is likelier first, but everything after it is poor; "b EOS" wins.
    table = markov_table(
        {BOS: {A: 0.5, B: 0.45}, A: {C: 0.35, EOS: 0.3, D: 0.3}, B: {EOS: 0.9}, C: {EOS: 0.5}}
    )
    best, _ = enumerate_best(table, max_length=4, alpha=0.0)
    greedy_ids, _ = greedy_search(
        markov_step(table), ops.full((1,), BOS, dtype="int32"), dummy_state(1), max_length=4, eos_id=EOS
    )
    assert decoded(to_numpy(greedy_ids)[0]) != best  # the premise
    ids, _ = search(table, beam_size=2, alpha=0.0, max_length=4)
    assert decoded(ids[0, 0]) == best == [B, EOS]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_without_length_penalty_is_greedy(seed):
    rng = np.random.default_rng(seed)
    table = np.log(rng.dirichlet(np.full(V, 0.3), size=V)).astype("float32")
    initial_ids = ops.full((5,), BOS, dtype="int32")
    greedy_ids, greedy_scores = greedy_search(
        markov_step(table), initial_ids, dummy_state(5), max_length=8, eos_id=EOS
    )
    ids, scores = search(table, beam_size=1, alpha=0.0, max_length=8, batch=5)
    np.testing.assert_array_equal(ids[:, 0], to_numpy(greedy_ids))
    np.testing.assert_allclose(scores[:, 0], to_numpy(greedy_scores), rtol=1e-5)


def test_n_best_are_distinct_sorted_and_scored_by_their_own_probability():
    rng = np.random.default_rng(3)
    table = np.log(rng.dirichlet(np.full(V, 0.5), size=V)).astype("float32")
    ids, scores = search(table, beam_size=4, alpha=0.6, max_length=6, batch=2)
    for sentence in range(2):
        hypotheses = [tuple(decoded(row)) for row in ids[sentence]]
        assert len(set(hypotheses)) == 4
        assert np.all(np.diff(scores[sentence]) <= 1e-6)
        for hypothesis, score in zip(hypotheses, scores[sentence]):
            sequence = (BOS,) + hypothesis
            log_prob = sum(table[a, b] for a, b in zip(sequence, sequence[1:]))
            np.testing.assert_allclose(score, log_prob / ((5 + len(hypothesis)) / 6) ** 0.6, rtol=1e-5)


def test_a_sentence_that_never_ends_returns_its_best_alive_hypothesis():
    rows = {t: {EOS: 1e-12, C: 0.5, D: 0.4} for t in range(V)}
    rows[C] = {EOS: 1e-12, D: 0.7}
    table = markov_table(rows)
    ids, scores = search(table, beam_size=3, alpha=0.6, max_length=4)
    assert EOS not in ids[0, 0]
    np.testing.assert_array_equal(ids[0, 0], [C, D, C, D])  # 0.5 * 0.7 * 0.5 * 0.7
    log_prob = table[BOS, C] + table[C, D] + table[D, C] + table[C, D]
    np.testing.assert_allclose(scores[0, 0], log_prob / length_penalty(4, 0.6), rtol=1e-5)


def test_the_search_stops_when_no_alive_hypothesis_can_win():
    # Both beams end at once with most of the mass; the rest cannot catch up.
    table = markov_table({BOS: {A: 0.5, B: 0.49}, A: {EOS: 0.999}, B: {EOS: 0.999}})
    calls = []

    def counting_step(ids, index, state):
        calls.append(index)
        return markov_step(table)(ids, index, state)

    with eager_loops():
        beam_search(
            counting_step, ops.full((1,), BOS, dtype="int32"), dummy_state(1),
            beam_size=2, alpha=0.6, max_length=20, eos_id=EOS,
        )
    assert len(calls) == 2


def test_the_search_goes_on_while_an_alive_hypothesis_can_still_win():
    # After one step both beams have ended ("a EOS" 0.3, "b EOS" 0.18), but
    # the alive "a c" (0.175) can still beat "b EOS" once normalized, and
    # "a c d EOS" (0.158 over 4 tokens) does.
    table = markov_table(
        {BOS: {A: 0.5, B: 0.3}, A: {EOS: 0.6, C: 0.35}, B: {EOS: 0.6, C: 0.35}, C: {D: 0.95}, D: {EOS: 0.95}}
    )
    two_best = enumerate_hypotheses(table, max_length=6, alpha=0.6)[:2]
    assert [hypothesis for hypothesis, _ in two_best] == [[A, EOS], [A, C, D, EOS]]  # the premise
    ids, scores = search(table, beam_size=2, alpha=0.6, max_length=6)
    assert [decoded(row) for row in ids[0]] == [[A, EOS], [A, C, D, EOS]]
    np.testing.assert_allclose(scores[0], [score for _, score in two_best], rtol=1e-5)


def test_each_sentence_keeps_its_own_length_limit():
    table = markov_table({t: {EOS: 1e-12, C: 0.9} for t in range(V)})
    ids, _ = beam_search(
        markov_step(table), ops.full((2,), BOS, dtype="int32"), dummy_state(2),
        beam_size=2, max_length=6, eos_id=EOS, sentence_max_length=ops.array([3, 6], "int32"),
    )
    ids = to_numpy(ids)
    np.testing.assert_array_equal(ids[0, 0], [C, C, C, 0, 0, 0])
    np.testing.assert_array_equal(ids[1, 0], [C] * 6)


def test_the_state_is_reordered_with_the_beams():
    # A second-order model: the step reads the token before last from its
    # state. If the search mixed up the rows of the state, the result would
    # differ from reading both tokens from `ids`.
    rng = np.random.default_rng(4)
    table = ops.convert_to_tensor(
        np.log(rng.dirichlet(np.full(V, 0.4), size=(V, V))).astype("float32")
    )

    def from_ids(ids, index, state):
        n = ops.shape(ids)[0]
        last = ops.slice(ids, [0, index], [n, 1])[:, 0]
        before = ops.slice(ids, [0, ops.maximum(index - 1, 0)], [n, 1])[:, 0]
        return ops.take(ops.reshape(table, (V * V, V)), before * V + last, axis=0), state

    def from_state(ids, index, state):
        n = ops.shape(ids)[0]
        last = ops.slice(ids, [0, index], [n, 1])[:, 0]
        logits = ops.take(ops.reshape(table, (V * V, V)), state * V + last, axis=0)
        return logits, last

    initial = ops.full((3,), BOS, dtype="int32")
    expected = beam_search(from_ids, initial, dummy_state(3), beam_size=3, max_length=7, eos_id=EOS)
    got = beam_search(from_state, initial, initial, beam_size=3, max_length=7, eos_id=EOS)
    np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(expected[0]))
    np.testing.assert_allclose(to_numpy(got[1]), to_numpy(expected[1]), rtol=1e-6)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_state_that_grows_in_phases_gives_the_search_of_a_whole_one(beam_size):
    """A second-order model whose state is a buffer of the tokens so far,
    as a cache is: step `index` reads position `index - 1` and writes
    position `index`. Grown in phases of 3, 6 and 9 positions, each step
    must see the first buffer long enough for it, and the search must equal
    the one over a buffer of all 9 positions from the start. No output
    ends (NEVER is no token), so every search runs through every phase."""
    NEVER = V
    rng = np.random.default_rng(5)
    table = ops.convert_to_tensor(
        np.log(rng.dirichlet(np.full(V, 0.4), size=(V, V))).astype("float32")
    )
    seen = []  # (index, buffer length) of each step

    def step_fn(ids, index, buffer):
        n = ops.shape(ids)[0]
        last = ops.slice(ids, [0, index], [n, 1])
        before = ops.slice(buffer, [0, ops.maximum(index - 1, 0)], [n, 1])
        seen.append((int(to_numpy(index)), ops.shape(buffer)[1]))
        logits = ops.take(ops.reshape(table, (V * V, V)), (before * V + last)[:, 0], axis=0)
        return logits, ops.slice_update(buffer, [0, index], last)

    def grow(buffer, length):
        grown.append(length)
        return ops.pad(buffer, [[0, 0], [0, length - ops.shape(buffer)[1]]])

    def run(length, **phases):
        initial = ops.full((3,), BOS, dtype="int32")
        buffer = ops.full((3, length), BOS, dtype="int32")
        if beam_size == 1:
            return greedy_search(step_fn, initial, buffer, max_length=9, eos_id=NEVER, **phases)
        return beam_search(step_fn, initial, buffer, beam_size=beam_size, max_length=9, eos_id=NEVER, **phases)

    grown = []
    with eager_loops():
        expected = run(9)
        seen.clear()
        got = run(3, state_lengths=(3, 6, 9), grow_state=grow)
    assert grown == [6, 9]
    indices = [index for index, _ in seen]
    assert max(indices) == 8  # the premise: the search ran to the last phase
    assert all(length == 3 * (index // 3 + 1) for index, length in seen), seen
    np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(expected[0]))
    np.testing.assert_allclose(to_numpy(got[1]), to_numpy(expected[1]), rtol=1e-6)


@pytest.mark.parametrize("phases", [None, (3, 6, 9)])
def test_two_steps_an_iteration_give_the_search_of_one(phases):
    """`steps_per_iteration=2` runs the steps of `beam_search` in pairs,
    testing the condition between pairs only. The search must be the same:
    a second-order model reading its state (reordered at every step, in
    buffers that grow in phases of 3, odd, so that single steps end each
    phase), four sentences with their own first tokens and limits, which
    end at different steps, the search after 7 steps, so that the last
    pair's second step runs after every sentence is done, and must change
    nothing."""
    rng = np.random.default_rng(11)
    probs = rng.dirichlet(np.full(V, 0.5), size=(V, V))
    probs[..., EOS] *= 2.0
    table = ops.convert_to_tensor(np.log(probs / probs.sum(-1, keepdims=True)).astype("float32"))
    steps_run = []

    def step_fn(ids, index, buffer):
        steps_run.append(index)
        n = ops.shape(ids)[0]
        last = ops.slice(ids, [0, index], [n, 1])
        before = ops.slice(buffer, [0, ops.maximum(index - 1, 0)], [n, 1])
        logits = ops.take(ops.reshape(table, (V * V, V)), (before * V + last)[:, 0], axis=0)
        return logits, ops.slice_update(buffer, [0, index], last)

    def grow(buffer, length):
        return ops.pad(buffer, [[0, 0], [0, length - ops.shape(buffer)[1]]])

    def run(steps):
        steps_run.clear()
        with eager_loops():
            found = beam_search(
                step_fn, ops.array([BOS, A, B, C], "int32"),
                ops.full((4, 9 if phases is None else 3), BOS, dtype="int32"),
                beam_size=3, max_length=9, eos_id=EOS,
                sentence_max_length=ops.array([9, 5, 8, 9], "int32"),
                state_lengths=phases, grow_state=None if phases is None else grow,
                steps_per_iteration=steps,
            )  # fmt: skip
        return len(steps_run), to_numpy(found[0]), to_numpy(found[1])

    (one_steps, *expected), (two_steps, *got) = run(1), run(2)
    ends = [decoded(row) for row in expected[0][:, 0]]
    assert len({len(tokens) for tokens in ends}) > 2, ends  # the premises
    assert (one_steps, two_steps) == (7, 8)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_two_steps_an_iteration_stop_at_the_pair_that_ends_the_search():
    # A model that allows "a c EOS" and "b d EOS" only: after 3 steps both
    # have ended and nothing is alive, so one step an iteration runs 3
    # steps, two run 4, and the fourth must not touch the third, empty,
    # hypothesis, which is filled from the alive ones. (After EOS, d is
    # the likeliest of the impossible tokens: a fourth step that extended
    # the alive ones would write it.)
    table = np.full((V, V), -1.0e9, "float32")
    for last, following, p in ((BOS, A, 0.6), (BOS, B, 0.4), (A, C, 1), (B, D, 1), (C, EOS, 1), (D, EOS, 1)):
        table[last, following] = np.log(p)
    table[EOS, D] = -6.0e8
    results = {}
    for steps in (1, 2):
        calls = []

        def counting_step(ids, index, state):
            calls.append(index)
            return markov_step(table)(ids, index, state)

        with eager_loops():
            ids, scores = beam_search(
                counting_step, ops.full((1,), BOS, dtype="int32"), dummy_state(1),
                beam_size=3, alpha=0.6, max_length=20, eos_id=EOS, steps_per_iteration=steps,
            )  # fmt: skip
        results[steps] = (len(calls), to_numpy(ids), to_numpy(scores))
    assert results[1][0] == 3 and results[2][0] == 4
    assert [decoded(row) for row in results[2][1][0][:2]] == [[A, C, EOS], [B, D, EOS]]
    np.testing.assert_array_equal(results[2][1], results[1][1])
    np.testing.assert_array_equal(results[2][2], results[1][2])


def test_bad_state_lengths_are_rejected():
    def run(lengths, grow=lambda state, length: state):
        return beam_search(
            markov_step(LENGTH_PENALTY_TABLE), ops.full((1,), BOS, dtype="int32"), dummy_state(1),
            beam_size=2, max_length=6, eos_id=EOS, state_lengths=lengths, grow_state=grow,
        )  # fmt: skip

    with pytest.raises(ValueError, match=r"increasing integers >= 1. Received: state_lengths=\(4, 4, 6\)"):
        run((4, 4, 6))
    with pytest.raises(ValueError, match=r"increasing integers >= 1. Received: state_lengths=\(0, 6\)"):
        run((0, 6))
    with pytest.raises(ValueError, match=r"reach max_length.*state_lengths=\(2, 4\), max_length=6"):
        run((2, 4))
    with pytest.raises(ValueError, match="need grow_state.*Received: state_lengths=\\(2, 6\\), grow_state=None"):
        run((2, 6), grow=None)
    with pytest.raises(ValueError, match=r"increasing integers >= 1. Received: state_lengths=\(\)"):
        run(())
    with pytest.raises(ValueError, match=r"increasing integers >= 1. Received: state_lengths=\(2.5, 6\)"):
        run((2.5, 6))


@pytest.mark.parametrize("n", [5000, 5120])
def test_top_k_by_chunks_equals_a_full_top_k(rng, n):
    """Best first, and among equal scores the lower index first (where the
    backend's top-k promises it), whichever chunks the ties fall in (n =
    5000 has a short last chunk, which holds one of the ties)."""
    k = 8
    scores = rng.normal(size=(4, n)).astype("float32")
    scores[0, [7, 300, 1000, 4999]] = 9.0  # a tie across chunks
    scores[1, 200:400] = 9.0  # more ties than k, in two chunks
    scores[2, :] = np.round(scores[2, :], 1)  # ties everywhere
    scores[3, [5, 260, 1300, 1301]] = [8.0, 8.0, 9.5, 8.0]  # the best chunk ties late
    values, indices = (to_numpy(x) for x in top_k(ops.convert_to_tensor(scores), k))
    expected = np.stack([np.lexsort((np.arange(n), -row))[:k] for row in scores])
    np.testing.assert_array_equal(values, np.take_along_axis(scores, expected, axis=1))
    np.testing.assert_array_equal(np.take_along_axis(scores, indices, axis=1), values)
    assert all(len(set(row)) == k for row in indices)
    if keras.backend.backend() != "torch":  # torch.topk orders ties as it likes
        np.testing.assert_array_equal(indices, expected)


def test_beam_search_over_a_large_vocabulary_finds_the_known_best():
    """With 600 tokens the search takes the top-k of 2,400 candidates by
    chunks; tokens beyond the first 7 are all but impossible."""
    wide = np.full((600, 600), -30.0, "float32")
    wide[:V, :V] = LENGTH_PENALTY_TABLE
    wide[V:, EOS] = 0.0
    for alpha in (0.0, 0.6):
        ids, _ = search(wide, beam_size=4, alpha=alpha, max_length=6)
        assert decoded(ids[0, 0]) == enumerate_best(LENGTH_PENALTY_TABLE, 6, alpha)[0]


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="beam_size must be at least 1. Received: beam_size=0"):
        search(LENGTH_PENALTY_TABLE, beam_size=0, alpha=0.6, max_length=4)
    for alpha in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"alpha must be a finite number >= 0.*Received: alpha={alpha}"):
            search(LENGTH_PENALTY_TABLE, beam_size=2, alpha=alpha, max_length=4)
    for steps in (0, 1.5, True):
        with pytest.raises(ValueError, match=f"steps_per_iteration must be an integer >= 1.*Received: steps_per_iteration={steps}"):
            beam_search(
                markov_step(LENGTH_PENALTY_TABLE), ops.full((1,), BOS, dtype="int32"), dummy_state(1),
                beam_size=2, max_length=4, eos_id=EOS, steps_per_iteration=steps,
            )  # fmt: skip


class eager_loops:
    """Runs `ops.while_loop` bodies as Python loops, so that they can be
    counted: JAX traces a loop body once unless jit is disabled."""

    def __enter__(self):
        self.context = None
        if keras.backend.backend() == "jax":
            import jax

            self.context = jax.disable_jit()
            self.context.__enter__()

    def __exit__(self, *exc):
        if self.context is not None:
            self.context.__exit__(*exc)


def test_the_power_penalty_ranks_hypotheses_cut_at_the_limit_with_the_finished_ones():
    """|Y|^alpha, as fairseq and transformers search: at the limit, an
    unfinished hypothesis that outscores the finished ones comes first;
    GNMT's search (the paper's) keeps the finished ones first."""
    table = markov_table({BOS: {EOS: 0.3, A: 0.7 - 1e-6}, A: {A: 0.99}})
    results = {}
    for penalty in ("gnmt", "power"):
        ids, scores = beam_search(
            markov_step(table), ops.full((1,), BOS, dtype="int32"), dummy_state(1),
            beam_size=2, alpha=1.0, max_length=3, eos_id=EOS, penalty=penalty,
        )  # fmt: skip
        results[penalty] = (decoded(to_numpy(ids)[0, 0]), float(to_numpy(scores)[0, 0]))
    assert results["gnmt"][0] == [EOS]
    cut = table[BOS, A] + 2 * table[A, A]
    assert results["power"][0] == [A, A, A]
    assert results["power"][1] == pytest.approx(cut / 3, rel=1e-5)
    with pytest.raises(ValueError, match=r"length_penalty must be one of \['gnmt', 'power'\]. Received: length_penalty='average'"):
        beam_search(
            markov_step(table), ops.full((1,), BOS, dtype="int32"), dummy_state(1), beam_size=2, alpha=1.0,
            max_length=3, eos_id=EOS, penalty="average",
        )  # fmt: skip


@pytest.mark.parametrize("direct", [False, True])
def test_the_extensions_log_probabilities_are_the_scores_plus_a_log_softmax(rng, direct):
    """Under torch's direct calls, torch's fused log softmax with the alive
    scores added in place, `[B, K, V]`; elsewhere None, and the search takes
    the logsumexp form. Both are `scores + log softmax(logits)`."""
    from keras_transformer.backend import norms
    from keras_transformer.backend.options import DecodingOptions

    logits = rng.normal(scale=4.0, size=(6, 300)).astype("float32")
    scores = rng.normal(size=(2, 3)).astype("float32")
    got = norms.log_softmax_plus(
        ops.convert_to_tensor(logits), ops.convert_to_tensor(scores), DecodingOptions(direct=direct)
    )
    if not (direct and keras.backend.backend() == "torch"):
        assert got is None
        return
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    expected = scores[:, :, None] + log_softmax.reshape(2, 3, 300)
    np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-5, atol=1e-5)


def test_a_forced_prefix_begins_every_hypothesis_at_no_cost_and_the_search_takes_over():
    """Each sentence's prefix is taken whatever its probability, adding 0 to
    the log-probability (transformers' forced BOS), and counted in the
    length; the best continuation is the enumeration's among sequences
    that begin with it."""
    prefixes = [[D, B], [C, A]]
    ids, scores = beam_search(
        markov_step(LENGTH_PENALTY_TABLE), ops.full((2,), BOS, dtype="int32"), dummy_state(2), beam_size=4,
        alpha=0.6, max_length=6, eos_id=EOS, forced_ids=ops.array(prefixes, "int32"),
    )
    greedy_ids, greedy_scores = greedy_search(
        markov_step(LENGTH_PENALTY_TABLE), ops.full((2,), BOS, dtype="int32"), dummy_state(2), max_length=6,
        eos_id=EOS, forced_ids=ops.array(prefixes, "int32"),
    )
    ids, scores, greedy_ids, greedy_scores = map(to_numpy, (ids, scores, greedy_ids, greedy_scores))
    for row, prefix in enumerate(prefixes):
        def cost(sequence):  # log P of the tokens after the prefix
            path = [BOS] + sequence
            return sum(LENGTH_PENALTY_TABLE[a, b] for a, b in list(zip(path, path[1:]))[len(prefix):])

        candidates = sorted(
            ((cost(hypothesis) / ((5 + len(hypothesis)) / 6) ** 0.6, hypothesis)
             for hypothesis, _ in enumerate_hypotheses(LENGTH_PENALTY_TABLE, 6, 0.0)
             if hypothesis[: len(prefix)] == prefix),
            key=lambda pair: -pair[0],
        )
        assert decoded(ids[row, 0]) == candidates[0][1]
        np.testing.assert_allclose(scores[row, 0], candidates[0][0], rtol=1e-5)
        # Greedy: the prefix, then the likeliest token after each.
        greedy = decoded(greedy_ids[row])
        assert greedy[: len(prefix)] == prefix
        for last, token in zip(greedy[len(prefix) - 1:], greedy[len(prefix):]):
            assert token == int(np.argmax(LENGTH_PENALTY_TABLE[last]))
        np.testing.assert_allclose(greedy_scores[row], cost(greedy), rtol=1e-5)


def test_forced_eos_ends_each_sentence_at_its_own_limit():
    table = markov_table({t: {EOS: 1e-12, C: 0.9} for t in range(V)})  # EOS never wins
    limits = ops.array([3, 6], "int32")
    ids, scores = beam_search(
        markov_step(table), ops.full((2,), BOS, dtype="int32"), dummy_state(2), beam_size=2, alpha=0.0,
        max_length=6, eos_id=EOS, sentence_max_length=limits, force_eos=True,
    )
    greedy_ids, greedy_scores = greedy_search(
        markov_step(table), ops.full((2,), BOS, dtype="int32"), dummy_state(2), max_length=6, eos_id=EOS,
        sentence_max_length=limits, force_eos=True,
    )
    for found, found_scores in ((to_numpy(ids)[:, 0], to_numpy(scores)[:, 0]), (to_numpy(greedy_ids), to_numpy(greedy_scores))):
        np.testing.assert_array_equal(found[0], [C, C, EOS, 0, 0, 0])
        np.testing.assert_array_equal(found[1], [C] * 5 + [EOS])
        # EOS, forced, costs nothing: the C's alone.
        np.testing.assert_allclose(found_scores, [2 * table[C, C], 5 * table[C, C]], rtol=1e-5)


@pytest.mark.parametrize("steps", [1, 2])
def test_a_batch_sheds_its_done_first_half_and_finds_what_it_would_have(steps):
    """With `narrow_step`, a batch of 16 sentences runs on without its first
    8 once they are done, then without the next 4: rows in order of limits,
    as `Translator` sorts them. Each sentence reads a bias of its own (what
    `narrow_step` must slice) and a state reordered with its beams, in
    phases. The outputs and scores must be those of the whole batch run to
    the end, and the steps of 16, 8 and 4 sentences end where the halves'
    limits say."""
    from keras_transformer.decoding.beam_search import SHED_FROM

    rng = np.random.default_rng(7)
    probs = rng.dirichlet(np.full(V, 0.5), size=(V, V))
    probs[..., EOS] *= 0.3  # most sentences run to their limits
    table = ops.convert_to_tensor(np.log(probs / probs.sum(-1, keepdims=True)).astype("float32"))
    bias = rng.normal(size=(16, V)).astype("float32")
    limits = np.array([3] * 8 + [6] * 4 + [9] * 4, "int32")
    beam_size, rows_run = 3, []

    def over(bias):
        def step_fn(ids, index, buffer):
            n = ops.shape(ids)[0]
            rows_run.append(n // beam_size)
            last = ops.slice(ids, [0, index], [n, 1])
            before = ops.slice(buffer, [0, ops.maximum(index - 1, 0)], [n, 1])
            logits = ops.take(ops.reshape(table, (V * V, V)), (before * V + last)[:, 0], axis=0)
            return logits + ops.repeat(ops.convert_to_tensor(bias), beam_size, axis=0), ops.slice_update(
                buffer, [0, index], last)

        return step_fn

    def run(narrow_step):
        rows_run.clear()
        with eager_loops():
            found = beam_search(
                over(bias), ops.convert_to_tensor(np.arange(16) % (V - 3) + 3, "int32"),
                ops.full((16, 3), BOS, dtype="int32"), beam_size=beam_size, max_length=9, eos_id=EOS,
                sentence_max_length=ops.convert_to_tensor(limits), state_lengths=(3, 6, 9),
                grow_state=lambda buffer, length: ops.pad(buffer, [[0, 0], [0, length - ops.shape(buffer)[1]]]),
                steps_per_iteration=steps, narrow_step=narrow_step,
            )  # fmt: skip
        return list(rows_run), to_numpy(found[0]), to_numpy(found[1])

    assert SHED_FROM <= 8  # the premise: 16 and 8 sentences shed, 4 do not
    (whole, *expected), (shed, *got) = run(None), run(lambda start: over(bias[start:]))
    assert set(whole) == {16}
    assert shed == sorted(shed, reverse=True)  # rows only leave
    assert 3 <= shed.count(16) <= 3 + steps - 1  # the first 8 end at their limit, 3
    assert 6 <= shed.count(16) + shed.count(8) <= 6 + steps - 1
    assert shed.count(4) > 0
    lengths = [int(np.count_nonzero(row)) for row in expected[0][:, 0]]
    assert max(lengths[:8]) == 3 and max(lengths[12:]) > 6, lengths  # the premises
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
