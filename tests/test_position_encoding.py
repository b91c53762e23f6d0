import keras
import numpy as np
import pytest

from keras_transformer.layers import SinusoidalPositionEncoding

from conftest import to_numpy


def closed_form(length, d_model, start=0):
    """Section 3.5 in float64: sin on even dimensions, cos on odd ones."""
    positions = np.arange(start, start + length, dtype="float64")[:, None]
    i = np.arange(d_model)[None, :] // 2
    angles = positions / 10000.0 ** (2 * i / d_model)
    return np.where(np.arange(d_model) % 2 == 0, np.sin(angles), np.cos(angles))


@pytest.mark.parametrize("d_model", [64, 7])
def test_matches_closed_form(d_model):
    x = np.zeros((2, 300, d_model), "float32")
    encoding = to_numpy(SinusoidalPositionEncoding()(x))
    assert encoding.shape == x.shape
    for row in encoding:
        np.testing.assert_allclose(row, closed_form(300, d_model), atol=1e-4)


def test_start_index_shifts_positions():
    layer = SinusoidalPositionEncoding()
    step = layer(np.zeros((1, 1, 32), "float32"), start_index=17)
    np.testing.assert_allclose(
        to_numpy(step)[0], closed_form(1, 32, start=17), atol=1e-5
    )
    as_tensor = layer(
        np.zeros((1, 1, 32), "float32"), start_index=keras.ops.convert_to_tensor(17)
    )
    np.testing.assert_allclose(to_numpy(as_tensor), to_numpy(step), atol=0)


def test_shift_by_k_is_a_fixed_linear_map():
    """PE(pos + k) = M_k PE(pos), with M_k the same for every pos (a rotation
    of each (sin, cos) pair by k times its frequency)."""
    d_model, k = 16, 5
    encoding = to_numpy(SinusoidalPositionEncoding()(np.zeros((1, 200, d_model))))[0]
    frequencies = 1.0 / 10000.0 ** (np.arange(0, d_model, 2) / d_model)
    m_k = np.zeros((d_model, d_model))
    for pair, w in enumerate(frequencies):
        c, s = np.cos(w * k), np.sin(w * k)
        # sin(a + b) = sin a cos b + cos a sin b; cos(a + b) = cos a cos b - sin a sin b
        m_k[2 * pair : 2 * pair + 2, 2 * pair : 2 * pair + 2] = [[c, s], [-s, c]]
    np.testing.assert_allclose(
        encoding[:-k] @ m_k.T, encoding[k:], atol=1e-4
    )


def test_no_maximum_length():
    encoding = to_numpy(SinusoidalPositionEncoding()(np.zeros((1, 6000, 8))))
    np.testing.assert_allclose(encoding[0, -3:], closed_form(6000, 8)[-3:], atol=2e-3)


def test_computed_in_float32_under_float16_policy():
    """float16 cannot resolve angles like 5000 * 1.0 radians; the layer
    computes in float32 and casts the result only."""
    layer = SinusoidalPositionEncoding(dtype="mixed_float16")
    encoding = layer(np.zeros((1, 5001, 8), "float16"))
    assert keras.backend.standardize_dtype(encoding.dtype) == "float16"
    expected = closed_form(5001, 8).astype("float32").astype("float16")
    np.testing.assert_allclose(
        to_numpy(encoding).astype("float32")[0, -1],
        expected[-1].astype("float32"),
        atol=2e-3,
    )
