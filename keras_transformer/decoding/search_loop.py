"""The loop of a search: a `while_loop` run in phases over a state that
grows, and the checks of its arguments."""

import numpy as np

from keras import ops

from keras_transformer.backend.loops import while_loop


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

    Phase p runs the steps whose `search.index` is below
    `state_lengths[p]`; between phases, `grow_state(search.state,
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
        condition, body: as for `ops.while_loop`, over `search`.
        search: the loop variables, a named tuple (`BeamState`,
            `GreedyState`) with the step about to run at `index` and the
            step function's state at `state`.
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
            search = search._replace(state=grow_state(search.state, length))
        end = length if steps_per_iteration == 1 else min(length, max_length)

        def fits(steps, end=end):
            """The condition, while `steps` more steps end by `end`."""
            return lambda search: ops.logical_and(
                condition(search), ops.less_equal(search.index + steps, end)
            )

        if steps_per_iteration > 1:
            search = while_loop(fits(steps_per_iteration), repeated, search, loops=loops)
        if steps_per_iteration == 1 or (end - start) % steps_per_iteration:
            search = while_loop(fits(1), body, search, loops=loops)  # the steps left
        start = length
    return search
