"""Beam search with a length penalty and a set of finished hypotheses.

The paper decodes with "beam search with a beam size of 4 and length penalty
alpha = 0.6" and a maximum output length of input length + 50, "but terminate
early when possible" (section 6.1). The length penalty is that of Wu et al.
(2016, GNMT):

    lp(Y) = ((5 + |Y|) / 6) ** alpha,        score(Y) = log P(Y | X) / lp(Y)

fairseq, Marian and transformers divide by |Y| ** alpha instead ("power"),
which a converted translator keeps to reproduce its published settings.

The search is a pure function over explicit loop state, written with
`keras.ops` and a `while_loop`, so that one compiled loop runs it
under `tf.function`, XLA and `jax.jit`, and eagerly under torch.
"""

import math
import numbers

import keras
from keras import ops

from keras_transformer.backend import norms
from keras_transformer.backend import shapes
from keras_transformer.decoding.search_loop import check_state_lengths
from keras_transformer.decoding.search_loop import forced_tokens
from keras_transformer.decoding.search_loop import top_k
from keras_transformer.decoding.search_loop import while_in_phases

# A log-probability no hypothesis reaches: it marks empty slots. Finite, so
# that sums and differences of it stay finite.
NEG_INF = -1.0e9


# A batch of this many sentences or more sheds its first half once that is
# done (rows in order of length, as `Translator` sorts them): the rest run
# on alone, in fewer rows. A batch waits for its longest output otherwise.
SHED_FROM = 8


def sheds(sentences):
    """How many times a batch of `sentences` sheds a half: a loop each."""
    count = 0
    while sentences >= SHED_FROM:
        sentences, count = sentences - sentences // 2, count + 1
    return count


# The forms of the length penalty: GNMT's, the paper's; |Y| ** alpha.
LENGTH_PENALTIES = ("gnmt", "power")


def length_penalty(length, alpha, form="gnmt"):
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, section 7), or
    |Y| ** alpha with `form="power"`."""
    length = ops.cast(length, "float32")
    if form == "power":
        return ops.power(length, alpha)
    return ops.power((5.0 + length) / 6.0, alpha)


def check_length_penalty(form):
    if form not in LENGTH_PENALTIES:
        raise ValueError(
            f"length_penalty must be one of {list(LENGTH_PENALTIES)}. Received: length_penalty={form!r}"
        )


def check_alpha(alpha):
    """The length penalty exponent must be a finite number >= 0: early
    stopping relies on lp growing with length, and a NaN alpha makes every
    score NaN, so that no search ends before its maximum length."""
    if (
        not isinstance(alpha, numbers.Real)
        or isinstance(alpha, bool)
        or not math.isfinite(alpha)
        or alpha < 0
    ):
        raise ValueError(
            f"alpha must be a finite number >= 0. Received: alpha={alpha!r}"
        )


def beam_search(
    step_fn,
    initial_ids,
    initial_state,
    beam_size=4,
    alpha=0.6,
    *,
    max_length,
    eos_id,
    sentence_max_length=None,
    state_lengths=None,
    grow_state=None,
    steps_per_iteration=1,
    penalty="gnmt",
    forced_ids=None,
    force_eos=False,
    narrow_step=None,
    decoding=None,
):
    """The `beam_size` best translations of each sentence, best first.

    Each step extends every alive hypothesis by every token and keeps the
    `2 * beam_size` best extensions by log-probability. Those among the
    first `beam_size` that end in `eos_id` join the finished set, scored
    with the length penalty; the `beam_size` best that do not end stay
    alive. Taking twice the beam keeps `beam_size` hypotheses alive however
    many end. A sentence is done when no alive hypothesis can still beat its
    worst finished one: log-probabilities only fall as a hypothesis grows,
    and lp only rises, so an alive hypothesis scores at most
    `log P / lp(sentence_max_length)`. The loop stops when every sentence is
    done or `max_length` tokens were generated. A sentence that finished
    fewer than `beam_size` hypotheses has the rest filled with its best
    alive ones, after the finished ones.

    With `beam_size=1` and `alpha=0` this is greedy search. With `alpha > 0`
    a single beam may continue past an EOS and return a longer hypothesis
    whose normalized score is higher.

    Args:
        step_fn: `step_fn(ids, index, state) -> (logits, state)`. `ids` is
            int32 `[batch * beam_size, max_length + 1]`: column 0 holds
            `initial_ids`, columns `1..index` the tokens chosen so far, and
            later columns are 0, so `ids[:, index]` is the token to extend.
            (A fixed shape lets one compiled loop serve every step.)
            `logits` are `[batch * beam_size, vocabulary_size]` scores for
            the token at position `index + 1`; log-probabilities work too.
            `state` is a nest of tensors whose first dimension is
            `batch * beam_size`, row `b * beam_size + k` being beam k of
            sentence b; the search reorders it as beams are chosen.
        initial_ids: int `[batch]`, the first token (BOS) of each sentence.
        initial_state: a nest of tensors with first dimension `batch`; each
            is repeated `beam_size` times for the step function.
        beam_size: hypotheses kept per sentence.
        alpha: the length penalty exponent; 0 ranks by log-probability.
        max_length: the most tokens generated (an int, or a scalar tensor
            under `tf.function`), EOS included.
        eos_id: the id that ends a hypothesis.
        sentence_max_length: optional int `[batch]`, each sentence's own
            limit (at most `max_length`), such as its source length + 50.
            Batching then does not change any sentence's result.
        state_lengths: optional increasing ints: the search runs in phases
            over a state that grows, holding `state_lengths[0]` positions
            at first (see `while_in_phases`). The last must be at least
            `max_length`.
        grow_state: `grow_state(state, length)`, with `state_lengths`; the
            state it gets has the step function's `batch * beam_size` rows.
        steps_per_iteration: search steps per iteration of the loop (an
            int; `max_length` and the `state_lengths` must then be ints).
            Each step reorders the state into a new buffer, and XLA copies
            a loop's new state back into the buffer of the old one, a
            second pass over every cached key and value. With two steps an
            iteration the second step writes into the buffer the first
            step read, and the copy is gone (`while_in_phases`).
        penalty: the length penalty's form, "gnmt" or "power".
        forced_ids: optional int `[batch, P]`, a target prefix: the first P
            tokens of every hypothesis, each taken at log-probability 0 (as
            transformers' `forced_bos_token_id` is); counted in its length.
        force_eos: with True, a hypothesis still alive at its sentence's
            limit takes EOS there (transformers' `forced_eos_token_id`).
        narrow_step: optional `narrow_step(start)`, `step_fn` over the
            sentences from `start` on alone (their rows of its state). With
            it, a batch of at least `SHED_FROM` sentences (a static batch
            size) runs on without its first half once that half is done,
            and again with the half left: in order of length, the shorter
            half ends first. Results are the same. The loops of those
            halves run at the last phase's `state_lengths`.
        decoding: the `backend.options.DecodingOptions` of the compiled
            function the search runs in (its loops, its direct calls), or
            None.

    Returns:
        `(ids, scores)`: int32 `[batch, beam_size, max_length]`, the
        generated tokens (without `initial_ids`; EOS, then 0s), and float32
        `[batch, beam_size]`, `log P / lp(length)`, best first.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1. Received: beam_size={beam_size}")
    check_alpha(alpha)
    check_length_penalty(penalty)
    check_state_lengths(state_lengths, grow_state, max_length)
    if (
        isinstance(steps_per_iteration, bool)
        or not isinstance(steps_per_iteration, int)
        or steps_per_iteration < 1
        or (steps_per_iteration > 1 and not isinstance(max_length, int))
    ):
        raise ValueError(
            "steps_per_iteration must be an integer >= 1, and above 1 only with "
            f"an int max_length. Received: steps_per_iteration={steps_per_iteration!r}, "
            f"max_length={max_length!r}"
        )
    initial_ids = ops.cast(initial_ids, "int32")
    batch_size = ops.shape(initial_ids)[0]
    if sentence_max_length is None:
        sentence_max_length = ops.full((batch_size,), max_length, dtype="int32")
    sentence_max_length = ops.cast(sentence_max_length, "int32")
    # Scores can only fall to log P / lp(limit) for an alive hypothesis.
    best_possible_lp = length_penalty(sentence_max_length, alpha, penalty)  # [B]

    positions = ops.arange(max_length + 1, dtype="int32")  # [L + 1]
    # The loop state. Only beam 0 is real at the start, so that the first
    # step expands it alone.
    initial = {
        "index": ops.convert_to_tensor(0, dtype="int32"),  # [], int32
        "alive_ids": ops.where(
            ops.equal(positions, 0)[None, None, :],
            initial_ids[:, None, None],
            ops.zeros((batch_size, beam_size, max_length + 1), dtype="int32"),
        ),  # [B, K, L + 1], int32
        "alive_log_probs": ops.where(
            ops.equal(ops.arange(beam_size), 0)[None, :],
            ops.zeros((batch_size, beam_size), dtype="float32"),
            ops.full((batch_size, beam_size), NEG_INF, dtype="float32"),
        ),  # [B, K], float32
        "finished_ids": ops.zeros(
            (batch_size, beam_size, max_length + 1), dtype="int32"
        ),  # [B, K, L + 1], int32
        "finished_scores": ops.full(
            (batch_size, beam_size), NEG_INF, dtype="float32"
        ),  # [B, K], float32, log P / lp
        "finished_flags": ops.zeros((batch_size, beam_size), dtype="bool"),  # [B, K]
        "state": keras.tree.map_structure(
            lambda x: ops.repeat(x, beam_size, axis=0), initial_state
        ),  # [B * K, ...]
    }

    def searching(start):
        """The loop's condition and body over sentences `start:`, and its
        `sentence_done` and `gather_beams`: `step_fn`'s for all, from 0."""
        rows = batch_size - start
        step = step_fn if start == 0 else narrow_step(start)
        limits, best_lp, prefix = (x if x is None or start == 0 else x[start:]
                                   for x in (sentence_max_length, best_possible_lp, forced_ids))
        forced = forced_tokens(prefix, force_eos, eos_id, limits)
        # The first flat row of each sentence, for the 1, 2 and 3 times K
        # rows a sentence has in the gathers; made once, not every step.
        first_rows = {
            beams: ops.arange(rows)[:, None] * beams
            for beams in (beam_size, 2 * beam_size, 3 * beam_size)
        }

        def gather_beams(x, beam_indices):
            """x[b, beam_indices[b, j]] for `x` of `[B, K_old, ...]`."""
            flat_indices = beam_indices + first_rows[shapes.shape(x)[1]]
            flat = ops.reshape(x, (-1,) + tuple(ops.shape(x)[2:]))
            gathered = shapes.take_rows(flat, ops.reshape(flat_indices, (-1,)), decoding)
            return ops.reshape(
                gathered, (rows, ops.shape(beam_indices)[1]) + tuple(ops.shape(x)[2:])
            )

        def sentence_done(search):
            best_alive = search["alive_log_probs"][:, 0] / best_lp  # [B]
            worst_finished = ops.min(
                ops.where(search["finished_flags"], search["finished_scores"], NEG_INF),
                axis=1,
            )  # [B]; NEG_INF until beam_size hypotheses finished
            return ops.logical_or(
                ops.logical_or(
                    ops.greater(worst_finished, best_alive),
                    ops.less(search["alive_log_probs"][:, 0], NEG_INF / 2),  # nothing alive
                ),
                ops.greater_equal(search["index"], limits),
            )

        def condition(search):
            return ops.logical_and(
                ops.less(search["index"], max_length),
                ops.logical_not(ops.all(sentence_done(search))),
            )

        def body(search):
            index = search["index"]
            alive_ids = search["alive_ids"]
            flat_ids = ops.reshape(alive_ids, (-1, max_length + 1))  # [B * K, L + 1]
            logits, new_state = step(flat_ids, index, search["state"])
            logits = ops.cast(logits, "float32")
            vocabulary_size = ops.shape(logits)[-1]
            # The 2K best extensions of the alive hypotheses.
            candidate_log_probs = norms.log_softmax_plus(logits, search["alive_log_probs"], decoding)
            if candidate_log_probs is None:
                # log softmax = logits - logsumexp(logits), with the logsumexp
                # added to the alive log-probabilities: one pass over the logits.
                offsets = search["alive_log_probs"] - ops.reshape(
                    ops.logsumexp(logits, axis=-1), (rows, beam_size)
                )  # [B, K]
                candidate_log_probs = offsets[:, :, None] + ops.reshape(
                    logits, (rows, beam_size, vocabulary_size)
                )
            candidate_log_probs = ops.reshape(candidate_log_probs, (rows, -1))  # [B, K * V]
            top_log_probs, top_indices = top_k(candidate_log_probs, 2 * beam_size)
            if forced is not None:
                top_log_probs, top_indices = _forced_extensions(
                    top_log_probs, top_indices, search["alive_log_probs"], vocabulary_size, *forced(index)
                )
            top_beams = top_indices // vocabulary_size  # [B, 2K]
            top_tokens = ops.cast(top_indices % vocabulary_size, "int32")
            top_ids = ops.where(
                ops.equal(positions, index + 1)[None, None, :],
                top_tokens[:, :, None],
                gather_beams(alive_ids, top_beams),
            )  # [B, 2K, L + 1]
            ends = ops.equal(top_tokens, eos_id)
            real = ops.greater(top_log_probs, NEG_INF / 2)
            # A sentence that is done keeps its hypotheses: none of its alive
            # ones can still beat its finished ones, and a step that runs
            # after every sentence is done (`steps_per_iteration`) changes
            # nothing.
            active = ops.logical_not(sentence_done(search))[:, None]  # [B, 1]

            # Alive: the K best extensions that did not end.
            new_alive_log_probs, alive_choice = ops.top_k(
                ops.where(ends, NEG_INF, top_log_probs), beam_size
            )
            new_alive_ids = gather_beams(top_ids, alive_choice)
            origin = shapes.take_along_axis(top_beams, alive_choice, axis=1, decoding=decoding)  # [B, K]
            state_rows = ops.reshape(origin + first_rows[beam_size], (-1,))

            # Finished: the old set and the ending extensions among the first K.
            among_first_k = ops.less(ops.arange(2 * beam_size), beam_size)[None, :]
            new_flags = ends & real & active & among_first_k
            new_scores = ops.where(
                new_flags, top_log_probs / length_penalty(index + 1, alpha, penalty), NEG_INF
            )
            finished_scores, finished_choice = ops.top_k(
                ops.concatenate([search["finished_scores"], new_scores], axis=1),
                beam_size,
            )
            return {
                "index": index + 1,
                "alive_ids": ops.where(active[:, :, None], new_alive_ids, alive_ids),
                "alive_log_probs": ops.where(
                    active, new_alive_log_probs, search["alive_log_probs"]
                ),
                "finished_ids": gather_beams(
                    ops.concatenate([search["finished_ids"], top_ids], axis=1),
                    finished_choice,
                ),
                "finished_scores": finished_scores,
                "finished_flags": shapes.take_along_axis(
                    ops.concatenate([search["finished_flags"], new_flags], axis=1),
                    finished_choice,
                    axis=1,
                    decoding=decoding,
                ),
                "state": keras.tree.map_structure(
                    lambda x: shapes.take_rows(x, state_rows, decoding), new_state
                ),
            }

        return condition, body, sentence_done, gather_beams

    def run(start, search, state_lengths):
        """The search of sentences `start:` from `search`, theirs. Rows in
        order of length, the first half's done, the rest run on without
        them (`SHED_FROM`); the state then keeps its last phase's length."""
        condition, body, sentence_done, _ = whole if start == 0 else searching(start)
        loops = None if decoding is None else decoding.loops
        rows = batch_size - start
        if narrow_step is None or not isinstance(rows, int) or rows < SHED_FROM:
            return while_in_phases(
                condition, body, search, state_lengths, grow_state, steps_per_iteration, max_length, loops=loops
            )
        half = rows // 2

        def first_half_running(search):
            return ops.logical_and(condition(search), ops.logical_not(ops.all(sentence_done(search)[:half])))

        search = while_in_phases(
            first_half_running, body, search, state_lengths, grow_state, steps_per_iteration, max_length,
            loops=loops,
        )
        rest = run(start + half, _sentences(search, half, None, beam_size), None)
        # The first half is done: as the whole loop would have left it. (The
        # state is not needed past the loop.)
        head = _sentences(search, 0, half, beam_size)
        return {"index": rest["index"], **{
            name: ops.concatenate([head[name], rest[name]], axis=0)
            for name in search if name not in ("index", "state")
        }}

    whole = searching(0)  # the whole batch's, made once: the loop's and the final gathers'
    search = run(0, initial, state_lengths)
    gather_beams = whole[3]

    # Finished hypotheses first (they are sorted and come before the empty
    # slots), then the best alive ones, which reached the sentence's limit.
    alive_scores = search["alive_log_probs"] / best_possible_lp[:, None]
    num_finished = ops.sum(ops.cast(search["finished_flags"], "int32"), axis=1)[:, None]
    slots = ops.arange(beam_size, dtype="int32")[None, :]
    choice = ops.where(
        ops.less(slots, num_finished), slots, beam_size + slots - num_finished
    )  # [B, K] into the 2K finished-then-alive hypotheses
    if penalty == "power":
        # fairseq's and transformers' rule: hypotheses cut at the sentence's
        # limit rank with the finished ones, by score.
        cut = ops.greater_equal(search["index"], sentence_max_length)[:, None]  # [B, 1]
        _, ranked = ops.top_k(
            ops.concatenate(
                [
                    ops.where(search["finished_flags"], search["finished_scores"], NEG_INF),
                    ops.where(cut & ops.greater(search["alive_log_probs"], NEG_INF / 2), alive_scores, 2 * NEG_INF),
                ],
                axis=1,
            ),
            beam_size,
        )
        choice = ops.where(cut, ops.cast(ranked, "int32"), choice)
    ids = gather_beams(
        ops.concatenate([search["finished_ids"], search["alive_ids"]], axis=1), choice
    )
    scores = shapes.take_along_axis(
        ops.concatenate([search["finished_scores"], alive_scores], axis=1),
        choice,
        axis=1,
        decoding=decoding,
    )
    return ids[:, :, 1:], scores


def _sentences(search, start, stop, beam_size):
    """The beam search's loop state of sentences `start:stop`."""
    return {
        name: value if name == "index" else keras.tree.map_structure(
            lambda x: x[start * beam_size : None if stop is None else stop * beam_size], value
        ) if name == "state" else value[start:stop]
        for name, value in search.items()
    }


def _forced_extensions(top_log_probs, top_indices, alive_log_probs, vocabulary_size, tokens, forcing):
    """The 2K best extensions `(log-probabilities, indices into K * V)`,
    where a sentence is forced: each alive beam extended by its token at no
    cost (log-probability 0), in the beams' order (best first), then K empty
    slots. What the search would take from extensions all but the token's
    made impossible, without a pass over them."""
    beam_size = ops.shape(alive_log_probs)[1]
    forced_log_probs = ops.concatenate([alive_log_probs, ops.full_like(alive_log_probs, NEG_INF)], axis=1)
    beams = ops.concatenate([ops.arange(beam_size, dtype="int32"), ops.zeros((beam_size,), dtype="int32")])
    forced_indices = ops.cast(beams[None, :] * vocabulary_size + tokens[:, None], top_indices.dtype)  # [B, 2K]
    return (
        ops.where(forcing[:, None], forced_log_probs, top_log_probs),
        ops.where(forcing[:, None], forced_indices, top_indices),
    )
