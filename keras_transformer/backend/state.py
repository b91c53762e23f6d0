"""Whether the running code is a compiled decoding call, per thread.

`decoding.compiled.CompiledFunction` opens a `decoding_call` around the
function it runs. Our layers and searches read it to choose how to compute:

- `direct()`: under torch, a built layer of ours runs its `call` without
  `Layer.__call__`, whose argument binding, mask walk and scopes cost more
  than a decoding step's arithmetic (`layers/calls.py`);
- `loops()`: under torch, the `backend.loops.TracedLoops` whose traces
  `backend.loops.while_loop` replays, or None;
- `compiled_by_xla()`: the function is being traced for XLA (JAX, or
  TensorFlow with `jit_compile`);
- `float_int8()`: under TensorFlow without XLA, int8 products are computed
  as float32 products of the int8 values (`backend.products`);
- `memoized(kind, inputs, make)`: in a search's step under torch's direct
  calls, what the attention layers derive from the model's masks (the same
  for every layer of a stack), made once a step;
- `writes_in_place()`: in a search's step under torch's direct calls, the
  self-attention caches are the search's alone, and written in place.

Outside a decoding call every answer is False (or None), and our code runs
Keras's own operations.
"""

import contextlib
import threading



class _State(threading.local):
    decoding = False
    direct = False
    loops = None
    xla = False
    float_int8 = False
    memo = None
    in_place = False


_state = _State()


@contextlib.contextmanager
def decoding_call(direct=False, loops=None, xla=False, float_int8=False):
    """Within this block, on this thread, code runs as a decoding call."""
    outer = (_state.decoding, _state.direct, _state.loops, _state.xla, _state.float_int8)
    _state.decoding, _state.direct, _state.loops = True, direct, loops if direct else None
    _state.xla, _state.float_int8 = xla, float_int8
    try:
        yield
    finally:
        (_state.decoding, _state.direct, _state.loops, _state.xla, _state.float_int8) = outer


@contextlib.contextmanager
def step_memo():
    """Within this block, on this thread, `memoized` computes each value once."""
    outer = _state.memo
    _state.memo = {}
    try:
        yield
    finally:
        _state.memo = outer


@contextlib.contextmanager
def search_step():
    """Within this block, on this thread, a search's step: under torch's
    direct calls, `memoized` computes each value once and the caches are
    written in place (the search holds its caches alone and drops the old
    ones); elsewhere nothing changes."""
    if not _state.direct:
        yield
        return
    outer = _state.in_place
    _state.in_place = True
    try:
        with step_memo():
            yield
    finally:
        _state.in_place = outer


def writes_in_place():
    return _state.in_place


def memoized(kind, inputs, make):
    """`make()`, computed once per `kind` and identical `inputs` (ints by
    value, the rest by identity) inside a `step_memo`, which keeps
    `inputs` alive so that no other object takes their ids; elsewhere
    computed each time."""
    memo = _state.memo
    if memo is None:
        return make()
    key = (kind,) + tuple(("int", x) if type(x) is int else id(x) for x in inputs)
    entry = memo.get(key)
    if entry is None:
        entry = memo[key] = (make(), inputs)
    return entry[0]


def decoding():
    """Whether a decoding call (no gradients, inference) is running."""
    return _state.decoding


def direct():
    return _state.direct


def loops():
    return _state.loops


def compiled_by_xla():
    return _state.xla


def float_int8():
    return _state.float_int8
