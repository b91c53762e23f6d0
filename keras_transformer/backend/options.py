"""How a compiled decoding call computes, as one frozen object.

`decoding.compiled.CompiledFunction` makes a `DecodingOptions` for its
backend and passes it down as a `decoding` argument: to the search, to
the model's cached step, to our layers and to the products they compute.
Code given `decoding=None` (training, Keras's `predict`, a user's call)
runs Keras's own operations.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
    """Options of one compiled decoding function.

    Attributes:
        direct: under torch, a built layer of ours runs its `call` without
            `Layer.__call__`, whose argument binding, mask walk and scopes
            cost more than a decoding step's arithmetic (`layers/calls.py`).
        loops: under torch, the `backend.loops.TracedLoops` whose records
            `backend.loops.while_loop` replays, or None.
        xla: the function is traced for XLA (JAX, or TensorFlow with
            `jit_compile`).
        float_int8: under TensorFlow without XLA, int8 products are
            computed as float32 products of the int8 values
            (`backend.products`).
        step: inside one step of a search under direct calls, the
            `SearchStep` whose memo the attention layers share and whose
            self-attention caches are written in place; else None.
    """

    direct: bool = False
    loops: object = None
    xla: bool = False
    float_int8: bool = False
    step: "SearchStep | None" = None

    def for_step(self):
        """These options for one step of a search, which holds its caches
        alone: under direct calls, with a fresh `SearchStep`."""
        return dataclasses.replace(self, step=SearchStep()) if self.direct else self


class SearchStep:
    """One search step's memo: what the attention layers derive from the
    model's masks (the same for every layer of a stack), made once."""

    def __init__(self):
        self._memo = {}

    def memoized(self, kind, inputs, make):
        """`make()`, computed once per `kind` and identical `inputs` (ints
        by value, the rest by identity); `inputs` are kept alive so that no
        other object takes their ids."""
        key = (kind,) + tuple(("int", x) if type(x) is int else id(x) for x in inputs)
        entry = self._memo.get(key)
        if entry is None:
            entry = self._memo[key] = (make(), inputs)
        return entry[0]


def memoized(decoding, kind, inputs, make):
    """`make()`, once per search step under `decoding`'s direct calls
    (`SearchStep.memoized`), else each time."""
    if decoding is None or decoding.step is None:
        return make()
    return decoding.step.memoized(kind, inputs, make)
