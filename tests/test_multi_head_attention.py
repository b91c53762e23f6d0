import warnings

import keras
import numpy as np
import pytest

from keras_transformer.layers import MultiHeadAttention

from conftest import to_numpy

B, T, S, D, H = 2, 5, 7, 16, 4


def _pair(rng, dropout=0.0):
    """Our layer and Keras's, built on the same shapes with the same weights."""
    ours = MultiHeadAttention(num_heads=H, dropout=dropout)
    reference = keras.layers.MultiHeadAttention(
        num_heads=H, key_dim=D // H, dropout=dropout
    )
    query = rng.normal(size=(B, T, D)).astype("float32")
    value = rng.normal(size=(B, S, D)).astype("float32")
    ours(query, value)
    reference(query, value)
    ours.set_weights(reference.get_weights())
    return ours, reference, query, value


def test_matches_keras_multi_head_attention_without_masks(rng):
    ours, reference, query, value = _pair(rng)
    np.testing.assert_allclose(
        to_numpy(ours(query, value)), to_numpy(reference(query, value)), atol=1e-5
    )


@pytest.mark.parametrize("return_scores", [False, True])
def test_matches_keras_multi_head_attention_with_masks(rng, return_scores):
    ours, reference, query, value = _pair(rng)
    value_mask = np.ones((B, S), bool)
    value_mask[0, 4:] = False
    value_mask[1, 2:] = False
    query_mask = np.ones((B, T), bool)
    query_mask[1, 3:] = False
    attention_mask = rng.random((B, T, S)) > 0.3
    attention_mask[..., 0] = True  # every query keeps one key
    kwargs = dict(
        query_mask=query_mask,
        value_mask=value_mask,
        attention_mask=attention_mask,
        return_attention_scores=return_scores,
    )
    ours_out = ours(query, value, **kwargs)
    reference_out = reference(query, value, **kwargs)
    # Padded queries attend to nothing here. Keras's own two paths disagree
    # there (zeros from its softmax, a uniform average from its fused
    # kernel), so the comparison covers the real queries.
    real = query_mask
    if return_scores:
        np.testing.assert_allclose(
            to_numpy(ours_out[1]).transpose(0, 2, 1, 3)[real],
            to_numpy(reference_out[1]).transpose(0, 2, 1, 3)[real],
            atol=1e-5,
        )
        ours_out, reference_out = ours_out[0], reference_out[0]
    np.testing.assert_allclose(
        to_numpy(ours_out)[real], to_numpy(reference_out)[real], atol=1e-5
    )


@pytest.mark.parametrize("return_scores", [False, True])
def test_query_with_no_key_gets_zero_attention(rng, return_scores):
    ours, _, query, value = _pair(rng)
    query_mask = np.ones((B, T), bool)
    query_mask[1, 3:] = False
    outputs = ours(
        query,
        value,
        query_mask=query_mask,
        return_attention_scores=return_scores,
    )
    output = to_numpy(outputs[0] if return_scores else outputs)
    # Zero attention leaves only the output projection's bias.
    bias = to_numpy(ours.output_dense.bias)
    np.testing.assert_allclose(output[1, 3:], np.broadcast_to(bias, (2, D)), atol=1e-6)
    assert np.abs(output[1, :3] - bias).max() > 1e-2


def test_matches_keras_multi_head_attention_with_causal_mask(rng):
    ours, reference, query, _ = _pair(rng)
    value = rng.normal(size=(B, T, D)).astype("float32")
    np.testing.assert_allclose(
        to_numpy(ours(query, value, use_causal_mask=True)),
        to_numpy(reference(query, value, use_causal_mask=True)),
        atol=1e-5,
    )


def test_keras_masks_are_read_from_inputs(rng):
    """A Keras mask on `value` (here from an Embedding) hides padding."""
    ids = np.array([[4, 5, 6, 0, 0], [7, 8, 0, 0, 0]])
    embedded = keras.layers.Embedding(10, D, mask_zero=True)(ids)
    query = rng.normal(size=(2, 3, D)).astype("float32")
    layer = MultiHeadAttention(num_heads=H)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, scores = layer(query, embedded, return_attention_scores=True)
    # The projections inside do not complain that they drop the mask.
    assert not [w for w in caught if "mask" in str(w.message)], caught
    scores = to_numpy(scores)
    assert np.all(scores[0, :, :, 3:] == 0) and np.all(scores[1, :, :, 2:] == 0)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)


def test_fused_and_explicit_paths_agree(rng):
    """The fused kernel and the written-out softmax compute the same thing."""
    layer, _, query, value = _pair(rng)
    value_mask = np.ones((B, S), bool)
    value_mask[1, 3:] = False
    fused = layer(query, value, value_mask=value_mask)
    explicit, _ = layer(
        query, value, value_mask=value_mask, return_attention_scores=True
    )
    np.testing.assert_allclose(to_numpy(fused), to_numpy(explicit), atol=1e-5)


def test_attention_dropout_acts_only_in_training(rng):
    layer, _, query, value = _pair(rng, dropout=0.5)
    inference = to_numpy(layer(query, value, training=False))
    np.testing.assert_allclose(inference, to_numpy(layer(query, value)), atol=1e-6)
    training = to_numpy(layer(query, value, training=True))
    assert np.abs(training - inference).max() > 1e-3


def test_key_dim_defaults_to_d_model_over_heads(rng):
    layer = MultiHeadAttention(num_heads=H)
    layer(np.zeros((1, 2, D), "float32"), np.zeros((1, 3, D), "float32"))
    assert tuple(layer.query_dense.kernel.shape) == (D, H, D // H)
    assert tuple(layer.output_dense.kernel.shape) == (H, D // H, D)


def test_d_model_not_divisible_by_heads_is_rejected():
    layer = MultiHeadAttention(num_heads=3)
    with pytest.raises(ValueError, match=r"d_model=16, num_heads=3"):
        layer(np.zeros((1, 2, 16), "float32"), np.zeros((1, 2, 16), "float32"))


@pytest.mark.parametrize(
    "name, shape",
    [("attention_mask", (B, T, S + 1)), ("attention_mask", (B, S)), ("value_mask", (B, S - 1))],
)
def test_mask_of_wrong_shape_is_rejected(rng, name, shape):
    layer, _, query, value = _pair(rng)
    with pytest.raises(ValueError, match=rf"`{name}` must have shape .*Received"):
        layer(query, value, **{name: np.ones(shape, bool)})


def test_self_attention_cache_equals_full_causal_attention(rng):
    """Step-by-step decoding with the cache gives the full outputs."""
    layer, _, _, _ = _pair(rng)
    x = rng.normal(size=(B, T, D)).astype("float32")
    full = to_numpy(layer(x, x, use_causal_mask=True))
    empty = np.zeros((B, H, T, D // H), "float32")  # [B, N, T, head_dim]
    cache = (empty, empty)
    for t in range(T):
        step, cache = layer(
            x[:, t : t + 1],
            x[:, t : t + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=t,
        )
        np.testing.assert_allclose(to_numpy(step)[:, 0], full[:, t], atol=1e-5)
    # The cache now holds the keys of every position, as a full pass has them,
    # each head's keys together: cache[0][b, n, t] is head n of position t.
    keys, _ = layer.compute_key_value(x)
    np.testing.assert_allclose(to_numpy(cache[0]), to_numpy(keys), atol=1e-6)
    projected = to_numpy(layer.key_dense(x.reshape(B * T, D))).reshape(B, T, H, D // H)
    np.testing.assert_allclose(
        to_numpy(keys), projected.transpose(0, 2, 1, 3), atol=1e-6
    )


def test_cross_attention_cache_equals_recomputation(rng):
    layer, _, query, value = _pair(rng)
    value_mask = np.ones((B, S), bool)
    value_mask[0, 5:] = False
    full = layer(query, value, value_mask=value_mask)
    cached, cache = layer(
        query, value, value_mask=value_mask, cache=layer.compute_key_value(value)
    )
    np.testing.assert_allclose(to_numpy(cached), to_numpy(full), atol=1e-6)
    # The cache is used as it is: the `value` argument is not projected again.
    ignored, _ = layer(
        query, np.zeros_like(value), value_mask=value_mask, cache=cache
    )
    np.testing.assert_allclose(to_numpy(ignored), to_numpy(full), atol=1e-6)


def test_config_round_trip():
    layer = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5, dropout=0.1)
    clone = MultiHeadAttention.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
