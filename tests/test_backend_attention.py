"""Attention on our layouts per backend (keras_transformer/backend/attention.py)."""


import keras
import numpy as np
import pytest
from conftest import in_one_pass
from conftest import to_numpy

import keras_transformer as kt
from keras_transformer.backend import attention
from keras_transformer.backend.options import DecodingOptions


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
        got = to_numpy(
            attention.dot_product_attention(
                queries,
                keys,
                keys * 2.0,
                None if case_mask is None else keras.ops.convert_to_tensor(case_mask),
                scale,
                DecodingOptions(direct=True) if decoding else None,
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
        expected = to_numpy(layer._attend_to_cache(query, key, value, case_mask, None))
        got = to_numpy(layer._attend_to_cache(query, key, value, case_mask, DecodingOptions(direct=True)))
        attends = np.ones((2, 3), bool) if case_mask is None else mask.any(-1)
        np.testing.assert_allclose(got[attends], expected[attends], rtol=1e-5, atol=1e-6)
    assert len(fused_calls) == (2 if keras.backend.backend() == "torch" else 0)


def test_jax_sends_long_half_precision_attention_on_a_gpu_to_cudnn_only_in_forms_it_takes():
    def implementation(shape, dtype="bfloat16", key_length=None, platform="gpu"):
        query = np.zeros(shape, dtype="float32")
        key = np.zeros((shape[0], key_length or shape[1]) + shape[2:], dtype="float32")
        query, key = (keras.ops.cast(keras.ops.convert_to_tensor(x), dtype) for x in (query, key))
        return attention.jax_implementation(query, key, platform=platform)

    assert implementation((2, 128, 8, 64)) == "cudnn"
    assert implementation((2, 256, 8, 64), "float16", key_length=130) == "cudnn"
    assert implementation((2, 128, 8, 64), "float32") == "xla"  # cuDNN: half precision only
    assert implementation((2, 129, 8, 64)) == "xla"  # odd query length
    assert implementation((2, 128, 8, 64), key_length=131) == "xla"  # odd key length
    assert implementation((2, 128, 8, 12)) == "xla"  # head size off cuDNN's grid
    assert implementation((2, 128, 8, 64), platform="cpu") == "xla"
    # Shorter than CUDNN_MIN_LENGTH on either side: XLA's is the faster.
    assert implementation((8, 32, 8, 64)) == "xla"
    assert implementation((2, 256, 8, 64), key_length=64) == "xla"
    with attention.xla_attention():  # asked for, to measure one against the other
        assert implementation((2, 128, 8, 64)) == "xla"


def test_the_cudnn_mask_form_gives_the_attention_of_our_mask():
    """cuDNN takes a `[B, 1, T, S]` mask; written out from a padding mask
    `[B, 1, S]` or a merged one `[B, T, S]`, it gives the same attention
    (XLA's implementation, on this machine) as the mask it came from."""
    import jax

    rng = np.random.default_rng(1)
    query, key, value = (rng.normal(size=(2, 4, 2, 8)).astype("float32") for _ in range(3))
    padding = np.array([[True] * 4, [True, True, False, False]])[:, None, :]  # [B, 1, S]
    merged = padding & np.tril(np.ones((4, 4), bool))[None]  # and causal: [B, T, S]
    for mask in (padding, merged):
        form = attention.cudnn_mask(mask, 4, 4)
        assert form.shape == (2, 1, 4, 4) and form.dtype == bool
        got = jax.nn.dot_product_attention(query, key, value, mask=form, scale=0.3, implementation="xla")
        expected = keras.ops.dot_product_attention(
            *(keras.ops.convert_to_tensor(x) for x in (query, key, value)),
            mask=keras.ops.convert_to_tensor(mask[:, None]),
            scale=0.3,
        )
        np.testing.assert_allclose(np.asarray(got), to_numpy(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="cuDNN's fused attention is reached under JAX only")
def test_where_cudnn_refuses_xla_attends_and_one_warning_says_why(monkeypatch):
    """On a GPU whose cuDNN refuses the fused attention while tracing (here:
    none is found), the attention is XLA's, the same as for float32 inputs,
    and the refusal is warned once, not at every call."""
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("this GPU's cuDNN may take the attention; the refusal is a CPU's")
    monkeypatch.setattr(attention, "jax_implementation", lambda query, key: "cudnn")
    monkeypatch.setattr(attention, "_refusals", [])
    rng = np.random.default_rng(2)
    query, key, value = (keras.ops.convert_to_tensor(rng.normal(size=(2, 4, 2, 8)), "bfloat16") for _ in range(3))
    mask = keras.ops.convert_to_tensor(np.array([[True] * 4, [True, True, False, False]])[:, None, :])
    with pytest.warns(UserWarning, match="refused here, so XLA's runs instead") as warned:
        first = attention.dot_product_attention(query, key, value, mask, 0.3)
        second = attention.dot_product_attention(query, key, value, mask, 0.3)
    assert len(warned) == 1 and len(attention._refusals) == 2
    expected = keras.ops.dot_product_attention(query, key, value, mask=mask[:, None], scale=0.3)
    np.testing.assert_array_equal(to_numpy(first).astype("float32"), to_numpy(expected).astype("float32"))
    np.testing.assert_array_equal(to_numpy(second).astype("float32"), to_numpy(first).astype("float32"))


@in_one_pass("torch", "the layers' shapes, dtypes and masks, the same code under every backend")
def test_a_mixed_bfloat16_training_step_reaches_attention_in_the_form_cudnn_takes(monkeypatch):
    """Every attention of a bfloat16 training step (encoder, masked decoder,
    encoder-decoder) reaches `attention.dot_product_attention` with inputs
    that a GPU would send to cuDNN, so that the fused path cannot be lost
    unseen by a change of layouts, dtypes or masks on the CPU."""
    model = kt.build_transformer("tiny", vocabulary_size=40, dtype="mixed_bfloat16")
    seen = []
    own = attention.dot_product_attention

    def recorded(query, key, value, mask, scale, decoding=None):
        seen.append((query, key, None if mask is None else to_numpy(mask)))
        return own(query, key, value, mask, scale, decoding)

    monkeypatch.setattr(attention, "dot_product_attention", recorded)
    batch = {
        "source_ids": np.array([[5, 6, 7, 8, 9, 2], [5, 6, 2, 0, 0, 0]], "int32"),
        "target_ids": np.array([[1, 5, 6, 7], [1, 5, 0, 0]], "int32"),
    }
    model(batch, training=True)
    assert len(seen) == 3 * model.config.num_layers
    for query, key, mask in seen:
        assert keras.backend.standardize_dtype(query.dtype) == "bfloat16"
        assert attention.cudnn_takes(query, key, platform="gpu")
        form = attention.cudnn_mask(mask, query.shape[1], key.shape[1])
        assert form.shape == (2, 1, query.shape[1], key.shape[1])
