"""Greedy search: the most likely next token at every step, until EOS.

A beam of one, without the finished set: `beam_search`'s loop state and
phases, over `[B]` sentences rather than `[B, K]` hypotheses.
"""

from typing import Any
from typing import NamedTuple

from keras import ops

from keras_transformer.decoding import processors as logits_processors
from keras_transformer.decoding.search_loop import check_state_lengths
from keras_transformer.decoding.search_loop import while_in_phases
from keras_transformer.decoding.selection import best_tokens
from keras_transformer.decoding.selection import forced_tokens


class GreedyState(NamedTuple):
    """The loop state of `greedy_search`, of B sentences."""

    index: Any  # int32 []: tokens generated so far; the step chooses token index + 1
    ids: Any  # int32 [B, L + 1]: BOS, the tokens so far, then 0s
    log_prob: Any  # float32 [B]: log P of the tokens so far
    finished: Any  # bool [B]: which sentences took EOS
    state: Any  # the step function's state, [B, ...]


def greedy_search(
    step_fn,
    initial_ids,
    initial_state,
    *,
    max_length,
    eos_id,
    sentence_max_length=None,
    state_lengths=None,
    grow_state=None,
    forced_ids=None,
    force_eos=False,
    processors=(),
    sampler=None,
    decoding=None,
):
    """The most likely next token at every step, until EOS; or, with a
    `sampler`, a token drawn at every step.

    Args:
        step_fn: `step_fn(ids, index, state) -> (logits, state)`, as in
            `beam_search` with a beam of 1: `ids` is `[batch, max_length + 1]`
            and `state` a nest of tensors with first dimension `batch`.
        initial_ids: int `[batch]`, the first token (BOS) of each sentence.
        initial_state: the step function's state for the first step.
        max_length: the most tokens generated, EOS included.
        eos_id: the id that ends a sentence.
        sentence_max_length: optional int `[batch]`, each sentence's own
            limit (at most `max_length`).
        state_lengths, grow_state: a state that grows in phases, as in
            `beam_search`.
        forced_ids, force_eos: a target prefix, and EOS at the limit, as
            in `beam_search`.
        processors: `decoding.processors` that change each step's logits
            before the best token is taken (as transformers' greedy search
            applies its logits processors). The scores stay the model's
            log-probabilities of the tokens taken.
        sampler: None, or a `decoding.sampling.Sampler` that draws each
            step's token from the changed logits instead of taking the best.
        decoding: as in `beam_search`.

    Returns:
        `(ids, scores)`: int32 `[batch, max_length]`, the generated tokens
        (EOS, then 0s), and float32 `[batch]`, their total log-probability.
    """
    check_state_lengths(state_lengths, grow_state, max_length)
    initial_ids = ops.cast(initial_ids, "int32")
    batch_size = ops.shape(initial_ids)[0]
    if sentence_max_length is None:
        sentence_max_length = ops.full((batch_size,), max_length, dtype="int32")
    sentence_max_length = ops.cast(sentence_max_length, "int32")
    forced = forced_tokens(forced_ids, force_eos, eos_id, sentence_max_length)
    positions = ops.arange(max_length + 1, dtype="int32")
    initial = GreedyState(
        index=ops.convert_to_tensor(0, dtype="int32"),
        ids=ops.where(
            ops.equal(positions, 0)[None, :],
            initial_ids[:, None],
            ops.zeros((batch_size, max_length + 1), dtype="int32"),
        ),
        log_prob=ops.zeros((batch_size,), dtype="float32"),
        finished=ops.zeros((batch_size,), dtype="bool"),
        state=initial_state,
    )

    def condition(search):
        done = ops.logical_or(search.finished, ops.greater_equal(search.index, sentence_max_length))
        return ops.logical_and(ops.less(search.index, max_length), ops.logical_not(ops.all(done)))

    def body(search):
        index, ids, finished = search.index, search.ids, search.finished
        logits, state = step_fn(ids, index, search.state)
        logits = ops.cast(logits, "float32")
        if processors or sampler is not None:
            scores = logits_processors.apply(processors, logits, logits_processors.Step(index, ids))
            tokens = best_tokens(scores)[0] if sampler is None else sampler(scores, index)
            chosen_logits = ops.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
        else:
            tokens, chosen_logits = best_tokens(logits)
        token_log_probs = chosen_logits - ops.logsumexp(logits, axis=-1)  # log softmax at the token
        if forced is not None:
            forced_token, forcing = forced(index)
            tokens = ops.where(forcing, forced_token, tokens)
            token_log_probs = ops.where(forcing, 0.0, token_log_probs)
        writing = ops.logical_and(ops.logical_not(finished), ops.less(index, sentence_max_length))
        ids = ops.where(
            ops.logical_and(ops.equal(positions, index + 1)[None, :], writing[:, None]),
            tokens[:, None],
            ids,
        )
        return GreedyState(
            index=index + 1,
            ids=ids,
            log_prob=search.log_prob + ops.where(writing, token_log_probs, 0.0),
            finished=ops.logical_or(finished, ops.logical_and(writing, ops.equal(tokens, eos_id))),
            state=state,
        )

    search = while_in_phases(
        condition, body, initial, state_lengths, grow_state,
        loops=None if decoding is None else decoding.loops,
    )
    return search.ids[:, 1:], search.log_prob
