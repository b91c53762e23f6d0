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

import functools
from typing import Any
from typing import NamedTuple

import keras
from keras import ops

from keras_transformer.backend import norms
from keras_transformer.backend import shapes
from keras_transformer.decoding import processors as logits_processors
from keras_transformer.decoding.search_loop import check_state_lengths
from keras_transformer.decoding.search_loop import while_in_phases
from keras_transformer.decoding.selection import NEG_INF
from keras_transformer.decoding.selection import forced_extensions
from keras_transformer.decoding.selection import forced_tokens
from keras_transformer.decoding.selection import top_k
from keras_transformer.decoding.settings import check_alpha
from keras_transformer.decoding.settings import check_early_stopping
from keras_transformer.decoding.settings import check_length_penalty


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


class BeamState(NamedTuple):
    """The loop state of `beam_search`, of B sentences and K beams."""

    index: Any  # int32 []: tokens generated so far; the step extends to index + 1
    done: Any  # bool [B]: the sentences done before their limit, which stay so (`early_stopping`'s bound may grow)
    alive_ids: Any  # int32 [B, K, L + 1]: BOS, the tokens so far, then 0s
    alive_log_probs: Any  # float32 [B, K]: log P of each alive hypothesis, best first
    finished_ids: Any  # int32 [B, K, L + 1]: the finished hypotheses, EOS last
    finished_scores: Any  # float32 [B, K]: their log P / lp, best first; NEG_INF in empty slots
    finished_flags: Any  # bool [B, K]: which slots hold a finished hypothesis
    state: Any  # the step function's state, [B * K, ...]


def length_penalty(length, alpha, form="gnmt"):
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, section 7), or
    |Y| ** alpha with `form="power"`."""
    length = ops.cast(length, "float32")
    if form == "power":
        return ops.power(length, alpha)
    return ops.power((5.0 + length) / 6.0, alpha)


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
    processors=(),
    early_stopping="never",
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
        early_stopping: when a sentence is done, as transformers'
            `early_stopping` says: "never" (the default, and exact), when
            no alive hypothesis can still beat the worst finished one, its
            score bounded at the sentence's limit as above; False, the same
            with its score bounded at the length it has (a guess that ends
            sooner); True, as False, and also as soon as `beam_size`
            hypotheses finished.
        processors: `decoding.processors` that change each step's
            log-probabilities before the beams are extended (transformers'
            beam search applies its logits processors there); the scores
            are then those of the changed log-probabilities.
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
    check_early_stopping(early_stopping)
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
    initial = BeamState(
        index=ops.convert_to_tensor(0, dtype="int32"),
        done=ops.zeros((batch_size,), dtype="bool"),
        alive_ids=ops.where(
            ops.equal(positions, 0)[None, None, :],
            initial_ids[:, None, None],
            ops.zeros((batch_size, beam_size, max_length + 1), dtype="int32"),
        ),
        alive_log_probs=ops.where(
            ops.equal(ops.arange(beam_size), 0)[None, :],
            ops.zeros((batch_size, beam_size), dtype="float32"),
            ops.full((batch_size, beam_size), NEG_INF, dtype="float32"),
        ),
        finished_ids=ops.zeros((batch_size, beam_size, max_length + 1), dtype="int32"),
        finished_scores=ops.full((batch_size, beam_size), NEG_INF, dtype="float32"),
        finished_flags=ops.zeros((batch_size, beam_size), dtype="bool"),
        state=keras.tree.map_structure(lambda x: ops.repeat(x, beam_size, axis=0), initial_state),
    )

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
            return ops.logical_or(ended(search), ops.greater_equal(search.index, limits))

        def ended(search):
            """The sentences done before their limit, by `early_stopping`'s rule."""
            bound = best_lp if early_stopping == "never" else length_penalty(ops.maximum(search.index, 1), alpha, penalty)
            best_alive = search.alive_log_probs[:, 0] / bound  # [B]
            worst_finished = ops.min(
                ops.where(search.finished_flags, search.finished_scores, NEG_INF),
                axis=1,
            )  # [B]; NEG_INF until beam_size hypotheses finished
            done = [
                ops.greater(worst_finished, best_alive),
                ops.less(search.alive_log_probs[:, 0], NEG_INF / 2),  # nothing alive
                search.done,  # done before, it stays so: `bound` may grow
            ]
            if early_stopping is True:
                done.append(ops.all(search.finished_flags, axis=1))  # beam_size hypotheses finished
            return functools.reduce(ops.logical_or, done)

        def condition(search):
            return ops.logical_and(
                ops.less(search.index, max_length),
                ops.logical_not(ops.all(sentence_done(search))),
            )

        def body(search):
            index = search.index
            alive_ids = search.alive_ids
            flat_ids = ops.reshape(alive_ids, (-1, max_length + 1))  # [B * K, L + 1]
            logits, new_state = step(flat_ids, index, search.state)
            logits = ops.cast(logits, "float32")
            vocabulary_size = ops.shape(logits)[-1]
            # The 2K best extensions of the alive hypotheses.
            if processors:
                log_probs = logits_processors.apply(
                    processors, ops.log_softmax(logits, axis=-1), logits_processors.Step(index, flat_ids)
                )
                candidate_log_probs = search.alive_log_probs[:, :, None] + ops.reshape(
                    log_probs, (rows, beam_size, vocabulary_size)
                )
            else:
                candidate_log_probs = norms.log_softmax_plus(logits, search.alive_log_probs, decoding)
            if candidate_log_probs is None:
                # log softmax = logits - logsumexp(logits), with the logsumexp
                # added to the alive log-probabilities: one pass over the logits.
                offsets = search.alive_log_probs - ops.reshape(
                    ops.logsumexp(logits, axis=-1), (rows, beam_size)
                )  # [B, K]
                candidate_log_probs = offsets[:, :, None] + ops.reshape(
                    logits, (rows, beam_size, vocabulary_size)
                )
            candidate_log_probs = ops.reshape(candidate_log_probs, (rows, -1))  # [B, K * V]
            top_log_probs, top_indices = top_k(candidate_log_probs, 2 * beam_size)
            if forced is not None:
                top_log_probs, top_indices = forced_extensions(
                    top_log_probs, top_indices, search.alive_log_probs, vocabulary_size, *forced(index)
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
                ops.concatenate([search.finished_scores, new_scores], axis=1),
                beam_size,
            )
            return BeamState(
                index=index + 1,
                done=ended(search),
                alive_ids=ops.where(active[:, :, None], new_alive_ids, alive_ids),
                alive_log_probs=ops.where(active, new_alive_log_probs, search.alive_log_probs),
                finished_ids=gather_beams(
                    ops.concatenate([search.finished_ids, top_ids], axis=1),
                    finished_choice,
                ),
                finished_scores=finished_scores,
                finished_flags=shapes.take_along_axis(
                    ops.concatenate([search.finished_flags, new_flags], axis=1),
                    finished_choice,
                    axis=1,
                    decoding=decoding,
                ),
                state=keras.tree.map_structure(lambda x: shapes.take_rows(x, state_rows, decoding), new_state),
            )

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
        return rest._replace(**{
            name: ops.concatenate([getattr(head, name), getattr(rest, name)], axis=0)
            for name in BeamState._fields if name not in ("index", "state")
        })

    whole = searching(0)  # the whole batch's, made once: the loop's and the final gathers'
    search = run(0, initial, state_lengths)
    gather_beams = whole[3]

    # Finished hypotheses first (they are sorted and come before the empty
    # slots), then the best alive ones, which reached the sentence's limit.
    alive_scores = search.alive_log_probs / best_possible_lp[:, None]
    num_finished = ops.sum(ops.cast(search.finished_flags, "int32"), axis=1)[:, None]
    slots = ops.arange(beam_size, dtype="int32")[None, :]
    choice = ops.where(
        ops.less(slots, num_finished), slots, beam_size + slots - num_finished
    )  # [B, K] into the 2K finished-then-alive hypotheses
    if penalty == "power":
        # fairseq's and transformers' rule: hypotheses cut at the sentence's
        # limit rank with the finished ones, by score.
        # (A sentence done before its limit keeps its finished ones.)
        cut = ops.logical_and(ops.greater_equal(search.index, sentence_max_length), ops.logical_not(search.done))[:, None]
        _, ranked = ops.top_k(
            ops.concatenate(
                [
                    ops.where(search.finished_flags, search.finished_scores, NEG_INF),
                    ops.where(cut & ops.greater(search.alive_log_probs, NEG_INF / 2), alive_scores, 2 * NEG_INF),
                ],
                axis=1,
            ),
            beam_size,
        )
        choice = ops.where(cut, ops.cast(ranked, "int32"), choice)
    ids = gather_beams(
        ops.concatenate([search.finished_ids, search.alive_ids], axis=1), choice
    )
    scores = shapes.take_along_axis(
        ops.concatenate([search.finished_scores, alive_scores], axis=1),
        choice,
        axis=1,
        decoding=decoding,
    )
    return ids[:, :, 1:], scores


def _sentences(search, start, stop, beam_size):
    """The beam search's loop state of sentences `start:stop`."""
    rows = slice(start * beam_size, None if stop is None else stop * beam_size)
    return BeamState(*(
        value if name == "index"
        else keras.tree.map_structure(lambda x: x[rows], value) if name == "state"
        else value[start:stop]
        for name, value in zip(BeamState._fields, search)
    ))
