"""Reshapes and cache writes per backend (keras_transformer/backend/shapes.py)."""


import keras
import numpy as np
import pytest
from conftest import to_numpy

from keras_transformer.backend import shapes
from keras_transformer.backend.options import DecodingOptions


def test_reshape_equals_keras_reshape():
    x = np.arange(2 * 3 * 4, dtype="float32").reshape(2, 3, 4)
    for shape in [(-1, 4), (6, 2, 2), (2, -1)]:
        np.testing.assert_array_equal(
            to_numpy(shapes.reshape(keras.ops.convert_to_tensor(x), shape)),
            to_numpy(keras.ops.reshape(x, shape)),
        )
    variable = keras.Variable(x)
    np.testing.assert_array_equal(to_numpy(shapes.reshape(variable, (4, 6))), x.reshape(4, 6))
    # A symbolic tensor is Keras's to reshape.
    symbolic = shapes.reshape(keras.KerasTensor((None, 3, 4)), (-1, 4))
    assert isinstance(symbolic, keras.KerasTensor) and tuple(symbolic.shape) == (None, 4)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="under TensorFlow and JAX shapes.reshape is keras.ops.reshape itself",
)
def test_under_torch_a_tensor_s_reshape_skips_keras_symbolic_check(monkeypatch):
    import keras.src.ops.numpy as keras_numpy

    checks = []
    check = keras_numpy.any_symbolic_tensors
    monkeypatch.setattr(keras_numpy, "any_symbolic_tensors", lambda *a, **k: checks.append(1) or check(*a, **k))
    x = keras.ops.ones((2, 3, 4))
    keras.ops.reshape(x, (-1, 4))
    assert len(checks) == 1  # Keras's own reshape checks its arguments
    shapes.reshape(x, (-1, 4))
    shapes.reshape(keras.Variable(np.ones((2, 3), "float32")), (3, 2))
    assert len(checks) == 1


@pytest.mark.parametrize("decoding", [False, True])
def test_cache_writes_equal_keras_slice_update_and_leave_the_input(decoding):
    """While decoding under torch, `slice_update` copies its input and
    writes the update as a block; on every backend, in a decoding call or
    not, its result must be Keras's, at int and tensor starts, and its
    input must be unchanged."""
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(2, 6, 3, 4)).astype("float32")
    two, one = (keras.ops.convert_to_tensor(i, "int32") for i in (2, 1))
    cases = [
        ([0, two, 0, 0], rng.normal(size=(2, 1, 3, 4)).astype("float32")),
        ([1, 2, 0, one], rng.normal(size=(1, 2, 3, 2)).astype("float32")),
    ]
    for starts, updates in cases:
        expected = to_numpy(keras.ops.slice_update(inputs, starts, updates))
        given = keras.ops.convert_to_tensor(inputs)
        options = DecodingOptions(direct=True) if decoding else None
        written = shapes.slice_update(given, starts, keras.ops.convert_to_tensor(updates), options)
        np.testing.assert_array_equal(to_numpy(written), expected)
        np.testing.assert_array_equal(to_numpy(given), inputs)
        assert not np.array_equal(expected, inputs)
        if decoding and keras.backend.backend() == "torch":
            # In a search's step the cache is the search's alone: written in place.
            written = shapes.slice_update(given, starts, keras.ops.convert_to_tensor(updates), options.for_step())
            assert written is given
            np.testing.assert_array_equal(to_numpy(given), expected)


@pytest.mark.parametrize("decoding", [False, True])
def test_slices_equal_keras_slice(decoding):
    """`shapes.slice`, which reads a decoding step's ids and position
    encodings, gives Keras's `slice` on every backend, at int and tensor
    starts, in a decoding call or not."""
    x = np.arange(4 * 6 * 3, dtype="float32").reshape(4, 6, 3)
    two, one = (keras.ops.convert_to_tensor(i, "int32") for i in (2, 1))
    for starts, shape in (([0, two, 0], [4, 1, 3]), ([1, 3, one], [2, 3, 2]), ([two, 0, 0], [2, 6, 3])):
        expected = to_numpy(keras.ops.slice(x, starts, shape))
        options = DecodingOptions(direct=True) if decoding else None
        got = shapes.slice(keras.ops.convert_to_tensor(x), starts, shape, options)
        np.testing.assert_array_equal(to_numpy(got), expected)
