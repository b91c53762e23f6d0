"""Loops recorded once and replayed under torch (keras_transformer/backend/loops.py)."""

import keras
import numpy as np
import pytest
from conftest import to_numpy

from keras_transformer.backend.loops import TracedLoops
from keras_transformer.backend.loops import while_loop


# `TracedLoops` is torch's: TensorFlow and JAX compile the whole search
# instead, which test_compiled.py checks under them.
torch_only = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="loop recording exists under torch only (torch.fx's make_fx); TensorFlow and JAX compile the whole "
    "search, which test_compiled.py checks on them",
)


@torch_only
def test_traced_loops_replay_with_each_calls_tensors_and_trace_again_for_new_constants():
    """Under torch, given `TracedLoops`, a `while_loop` runs its condition and body eagerly the first time, records
    them the second and replays the records after. Each
    call must bring its own tensors (the loop's and those its functions
    close over); a Python number in a closure is part of the trace, so a
    new one traces again; loop variables, and a tensor of the closure, that
    start as one tensor must still part; a closure holding a NumPy array is
    not traced."""
    import torch

    layer = keras.layers.Dense(3)
    layer.build((None, 3))
    loops = TracedLoops(layer)
    rng = np.random.default_rng(0)

    def run(start, shift, limit, loops=None):
        shift = keras.ops.convert_to_tensor(shift)
        x = keras.ops.convert_to_tensor(start)

        def condition(i, x, y):
            return keras.ops.less(i, limit)

        def body(i, x, y):  # reads the first x too, the loop's x at the start
            return i + 1, layer(x) + shift + first, y * 2.0 + x

        first = x
        return while_loop(condition, body, (keras.ops.convert_to_tensor(0), x, x), loops=loops)

    def check(start, shift, limit):
        expected = run(start, shift, limit)
        with torch.no_grad():
            got = run(start, shift, limit, loops)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-6)

    def draw():
        return rng.normal(size=(2, 3)).astype("float32")

    check(draw(), draw(), 3)
    assert (loops.count, loops.refused, loops.eager) == (0, 0, 2)  # the condition and body met once
    check(draw(), draw(), 3)
    assert (loops.count, loops.refused) == (2, 0)
    check(draw(), draw(), 3)
    assert loops.count == 2
    check(draw(), draw(), 4)
    check(draw(), draw(), 4)
    assert loops.count == 3  # the condition's limit is new; the body is as before
    with torch.no_grad():
        array = draw()
        i, x, y = while_loop(
            lambda i, x, y: keras.ops.less(i, 2),
            lambda i, x, y: (i + 1, x + array, y),
            (keras.ops.convert_to_tensor(0), keras.ops.convert_to_tensor(array), keras.ops.convert_to_tensor(array)),
            loops=loops,
        )
    np.testing.assert_allclose(to_numpy(x), 3 * array, rtol=1e-6)
    assert (loops.count, loops.refused) == (3, 0)  # not tried: Keras's loop runs it


@torch_only
def test_recording_a_loop_shows_the_user_no_warning():
    """torch 2.13 deprecates `torch.jit.trace`, which the quick start once
    showed at every traced loop; the recorder warns of nothing."""
    import warnings

    import torch

    layer = keras.layers.Dense(3)
    layer.build((None, 3))
    loops = TracedLoops(layer)
    def condition(i, x):
        return keras.ops.less(i, 3)

    def body(i, x):
        return i + 1, layer(x)

    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(2):
            while_loop(condition, body, (keras.ops.convert_to_tensor(0), keras.ops.ones((2, 3))), loops=loops)
    assert loops.count == 2
    assert not [str(w.message) for w in caught]
