"""Reshapes without Keras's symbolic check under torch (torch_shapes.py)."""

import keras
import numpy as np
import pytest
from conftest import to_numpy

from keras_transformer import torch_shapes


def test_reshape_equals_keras_reshape():
    x = np.arange(2 * 3 * 4, dtype="float32").reshape(2, 3, 4)
    for shape in [(-1, 4), (6, 2, 2), (2, -1)]:
        np.testing.assert_array_equal(
            to_numpy(torch_shapes.reshape(keras.ops.convert_to_tensor(x), shape)),
            to_numpy(keras.ops.reshape(x, shape)),
        )
    variable = keras.Variable(x)
    np.testing.assert_array_equal(to_numpy(torch_shapes.reshape(variable, (4, 6))), x.reshape(4, 6))
    # A symbolic tensor is Keras's to reshape.
    symbolic = torch_shapes.reshape(keras.KerasTensor((None, 3, 4)), (-1, 4))
    assert isinstance(symbolic, keras.KerasTensor) and tuple(symbolic.shape) == (None, 4)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="under TensorFlow and JAX torch_shapes.reshape is keras.ops.reshape itself",
)
def test_under_torch_a_tensor_s_reshape_skips_keras_symbolic_check(monkeypatch):
    import keras.src.ops.numpy as keras_numpy

    checks = []
    check = keras_numpy.any_symbolic_tensors
    monkeypatch.setattr(keras_numpy, "any_symbolic_tensors", lambda *a, **k: checks.append(1) or check(*a, **k))
    x = keras.ops.ones((2, 3, 4))
    keras.ops.reshape(x, (-1, 4))
    assert len(checks) == 1  # Keras's own reshape checks its arguments
    torch_shapes.reshape(x, (-1, 4))
    torch_shapes.reshape(keras.Variable(np.ones((2, 3), "float32")), (3, 2))
    assert len(checks) == 1
