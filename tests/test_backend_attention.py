"""Attention on our layouts per backend (keras_transformer/backend/attention.py)."""

import contextlib

import keras
import numpy as np
import pytest
from conftest import to_numpy

import keras_transformer as kt
from keras_transformer.backend import attention
from keras_transformer.backend import state


@pytest.mark.parametrize("decoding", [False, True])
def test_attention_equals_keras_dot_product_attention(decoding):
    """While decoding under torch, torch's fused attention gets the
    transposed views of the inputs instead of contiguous copies; on every
    backend, in a decoding call or not, the result must be Keras's, with
    and without a mask, for a query that may attend to no key, and for keys
    and values that are views of a larger cache."""
    rng = np.random.default_rng(0)
    query = rng.normal(size=(2, 3, 2, 4)).astype("float32")  # [B, T, N, H]
    cache = rng.normal(size=(2, 2, 5, 4)).astype("float32")  # [B, N, S, H]
    mask = rng.random((2, 3, 5)) < 0.6
    mask[0, 1] = False  # attends to no key
    for case_mask, scale in ((None, 0.5), (mask, 0.5), (mask, 0.3)):
        heads = keras.ops.convert_to_tensor(cache)
        keys = keras.ops.transpose(heads, (0, 2, 1, 3))  # a view under torch
        queries = keras.ops.convert_to_tensor(query)
        keras_mask = None if case_mask is None else keras.ops.convert_to_tensor(case_mask[:, None])
        expected = to_numpy(
            keras.ops.dot_product_attention(queries, keys, keys * 2.0, mask=keras_mask, scale=scale)
        )
        with state.decoding_call(direct=True) if decoding else contextlib.nullcontext():
            got = to_numpy(
                attention.dot_product_attention(
                    queries,
                    keys,
                    keys * 2.0,
                    None if case_mask is None else keras.ops.convert_to_tensor(case_mask),
                    scale,
                )
            )
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        assert np.all(np.isfinite(got))


def test_attention_over_a_cache_while_decoding_equals_the_written_out_softmax(monkeypatch):
    """While decoding under torch, attention over a heads-major cache is
    torch's fused attention; elsewhere it stays written out. Either way it
    equals the softmax of `MultiHeadAttention`, a query that may attend to
    no key included."""
    layer = kt.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    layer.build((2, 3, 8), (2, 5, 8))
    rng = np.random.default_rng(0)
    query = keras.ops.convert_to_tensor(rng.normal(size=(2, 3, 2, 4)).astype("float32"))
    key, value = (
        keras.ops.convert_to_tensor(rng.normal(size=(2, 2, 5, 4)).astype("float32"))
        for _ in range(2)
    )  # [B, N, S, H]
    mask = rng.random((2, 3, 5)) < 0.6
    mask[0, 1] = False
    fused_calls = []
    if keras.backend.backend() == "torch":
        import torch

        fused = torch.nn.functional.scaled_dot_product_attention

        def counted(*args, **kwargs):
            fused_calls.append(1)
            return fused(*args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    for case_mask in (None, keras.ops.convert_to_tensor(mask)):
        expected = to_numpy(layer._attend_to_cache(query, key, value, case_mask))
        with state.decoding_call(direct=True):
            got = to_numpy(layer._attend_to_cache(query, key, value, case_mask))
        attends = np.ones((2, 3), bool) if case_mask is None else mask.any(-1)
        np.testing.assert_allclose(got[attends], expected[attends], rtol=1e-5, atol=1e-6)
    assert len(fused_calls) == (2 if keras.backend.backend() == "torch" else 0)

