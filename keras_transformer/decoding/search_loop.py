"""The loop of a search: a top-k for large vocabularies, and a
`while_loop` run in phases over a state that grows."""

import math

import numpy as np

from keras import ops

from keras_transformer.backend.loops import while_loop


def top_k(scores, k, chunk_size=128):
    """`ops.top_k(scores, k)` of float `[B, n]` scores, for k far below n.

    The k best scores of a row lie in the k chunks of `chunk_size`
    consecutive scores whose maxima are best: a chunk left out has a
    maximum no better than each of k chunks taken, and each of those holds
    a score at least that good (with ties, a lower index). So one maximum
    per chunk, a top-k over the maxima, and a top-k over the chosen chunks'
    scores find them. XLA's top-k looks at every one of the `B * n` scores
    (a beam search's `beam_size * vocabulary_size` candidates per sentence)
    several times more slowly than it takes their maxima. Among equal scores the lower index
    comes first where `ops.top_k` puts it first (TensorFlow and JAX; torch's
    top-k orders ties as it likes).

    Returns:
        `(values [B, k], indices [B, k])`, best first.
    """
    n = scores.shape[-1]
    if not isinstance(n, int) or n <= 2 * k * chunk_size:
        return ops.top_k(scores, k)
    batch_size = ops.shape(scores)[0]
    whole = n - n % chunk_size  # the scores of whole chunks; the rest is a short last chunk
    maxima = ops.max(ops.reshape(scores[:, :whole], (batch_size, -1, chunk_size)), axis=-1)
    if whole < n:  # its maximum apart, rather than a padded copy of every score
        maxima = ops.concatenate([maxima, ops.max(scores[:, whole:], axis=-1, keepdims=True)], axis=1)
    _, best_chunks = ops.top_k(maxima, k)
    best_chunks = ops.sort(best_chunks, axis=-1)  # in index order, for ties
    if whole == n:  # the chosen chunks, gathered whole
        chunks = ops.take_along_axis(
            ops.reshape(scores, (batch_size, -1, chunk_size)), best_chunks[:, :, None], axis=1
        )
        values, positions = ops.top_k(ops.reshape(chunks, (batch_size, k * chunk_size)), k)
        chunk = ops.take_along_axis(best_chunks, positions // chunk_size, axis=1)
        return values, chunk * chunk_size + positions % chunk_size
    indices = ops.reshape(
        best_chunks[:, :, None] * chunk_size + ops.arange(chunk_size, dtype=best_chunks.dtype),
        (batch_size, k * chunk_size),
    )  # [B, k * C], in index order
    candidates = ops.where(  # the short chunk's positions past n score nothing
        ops.less(indices, n), ops.take_along_axis(scores, ops.minimum(indices, n - 1), axis=1), -math.inf
    )
    values, positions = ops.top_k(candidates, k)
    return values, ops.take_along_axis(indices, positions, axis=1)


def forced_tokens(forced_ids, force_eos, eos_id, sentence_max_length):
    """The tokens the search must take, as a function of the step:
    `forced_ids[:, index]` while the forced prefix lasts (int `[B, P]`, or
    None), then EOS at the sentence's limit with `force_eos` (the last
    token a sentence may have, as transformers' `forced_eos_token_id`
    forces it). Made once, before the loop; None if nothing is ever forced.

    Returns:
        None, or `at(index) -> (tokens [B], forcing [B] bool)`.
    """
    if forced_ids is None and not force_eos:
        return None
    batch_size = ops.shape(sentence_max_length)[0]
    # At least 0: a warm-up that never ends (EOS -1) still names a token.
    # (A sum, not `full`: under torch, `full` reads a tensor EOS to the host.)
    eos = ops.zeros((batch_size,), dtype="int32") + ops.cast(ops.maximum(eos_id, 0), "int32")
    prefix_length = 0 if forced_ids is None else ops.shape(forced_ids)[1]
    # The prefix, then a column past it, so that any step names one.
    columns = eos[:, None] if forced_ids is None else ops.concatenate([ops.cast(forced_ids, "int32"), eos[:, None]], axis=1)
    never = ops.zeros((batch_size,), dtype="bool")

    def at(index):
        tokens = ops.take(columns, ops.minimum(index, prefix_length), axis=1)  # [B]
        at_limit = ops.greater_equal(index + 1, sentence_max_length) if force_eos else never
        return tokens, ops.logical_or(ops.less(index, prefix_length), at_limit)

    return at


def check_prefix(prefix, vocabulary_size, max_extra_length):
    """A target prefix as a list of ids, each in the vocabulary, shorter
    than an output may be."""
    if prefix is None:
        return []
    ids = list(prefix) if isinstance(prefix, (list, tuple, np.ndarray)) else None
    if ids is None or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids) or any(
            not 0 < i < vocabulary_size for i in ids) or len(ids) >= max_extra_length:
        raise ValueError(
            f"target_prefix must be a list of fewer than max_extra_length={max_extra_length} token ids in "
            f"[1, {vocabulary_size}). Received: target_prefix={prefix!r}"
        )
    return [int(i) for i in ids]


def check_state_lengths(state_lengths, grow_state, max_length):
    """`state_lengths` must be increasing Python ints (each phase has its own
    shapes) that reach `max_length`, and come with `grow_state`."""
    if state_lengths is None:
        return
    lengths = list(state_lengths)
    if (
        not lengths
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths)
        or any(b <= a for a, b in zip(lengths, lengths[1:]))
    ):
        raise ValueError(
            "state_lengths must be increasing integers >= 1. "
            f"Received: state_lengths={state_lengths!r}"
        )
    if isinstance(max_length, int) and lengths[-1] < max_length:
        raise ValueError(
            "The state must reach max_length positions in its last phase. "
            f"Received: state_lengths={state_lengths!r}, max_length={max_length}"
        )
    if len(lengths) > 1 and grow_state is None:
        raise ValueError(
            "state_lengths of more than one phase need grow_state to grow the "
            f"state between them. Received: state_lengths={state_lengths!r}, grow_state=None"
        )


def while_in_phases(
    condition, body, search, state_lengths, grow_state, steps_per_iteration=1, max_length=None, loops=None
):
    """`keras.ops.while_loop(condition, body, search)`, run in phases over a state
    that grows.

    Phase p runs the steps whose `search["index"]` is below
    `state_lengths[p]`; between phases, `grow_state(search["state"],
    state_lengths[p + 1])` enlarges the state. A cache of past positions can
    so be as long as the output so far (rounded up to its phase's length)
    instead of as long as the longest output: the attention over it and its
    reordering between beams do that much less work. Each phase is a loop of
    its own, with its own shapes, so a compiled search compiles one loop body
    per phase.

    With `steps_per_iteration` n > 1, each phase first runs n steps per
    iteration while n more steps fit in the phase and in `max_length`, then
    single steps. The condition is tested before each iteration, not
    between its steps, so `body` must leave a search that `condition`
    ended as it is.

    Args:
        condition, body: as for `ops.while_loop`, over the dict `search`.
        search: the loop variables, a dict with the step about to run at
            `"index"` and the state at `"state"`.
        state_lengths: None (one loop), or increasing lengths, the state
            given holding the first.
        grow_state: `grow_state(state, length)`.
        steps_per_iteration: n, an int.
        max_length: the most steps (an int), with `steps_per_iteration`.
        loops: under torch, the `backend.loops.TracedLoops` that records
            and replays the loops, or None.
    """
    if state_lengths is None and steps_per_iteration == 1:
        return while_loop(condition, body, search, loops=loops)

    def repeated(search):
        for _ in range(steps_per_iteration):
            search = body(search)
        return search

    limits = [max_length] if state_lengths is None else list(state_lengths)
    start = 0
    for phase, length in enumerate(limits):
        if phase:
            search = {**search, "state": grow_state(search["state"], length)}
        end = length if steps_per_iteration == 1 else min(length, max_length)

        def fits(steps, end=end):
            """The condition, while `steps` more steps end by `end`."""
            return lambda search: ops.logical_and(
                condition(search), ops.less_equal(search["index"] + steps, end)
            )

        if steps_per_iteration > 1:
            search = while_loop(fits(steps_per_iteration), repeated, search, loops=loops)
        if steps_per_iteration == 1 or (end - start) % steps_per_iteration:
            search = while_loop(fits(1), body, search, loops=loops)  # the steps left
        start = length
    return search
