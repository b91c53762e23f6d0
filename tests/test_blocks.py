import math

import keras
import numpy as np
import pytest

from keras_transformer.layers import PositionwiseFeedForward
from keras_transformer.layers import TokenEmbedding
from keras_transformer.layers import TransformerDecoderBlock
from keras_transformer.layers import TransformerEncoderBlock

from conftest import to_numpy

B, S, T, D = 2, 6, 5, 16


def test_token_embedding_scales_by_sqrt_d_model_and_projects_back(rng):
    layer = TokenEmbedding(vocabulary_size=11, d_model=D)
    ids = np.array([[1, 4, 10], [0, 2, 2]])
    embedded = to_numpy(layer(ids))
    matrix = to_numpy(layer.embeddings)
    np.testing.assert_allclose(embedded, matrix[ids] * math.sqrt(D), rtol=1e-6)
    states = rng.normal(size=(2, 3, D)).astype("float32")
    np.testing.assert_allclose(
        to_numpy(layer(states, reverse=True)), states @ matrix.T, atol=1e-5
    )


def embedding_gradient(layer, ids):
    """d(sum of the float32 embeddings of `ids`) / dE, on any backend."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        def total(weights):
            embedded, _ = layer.stateless_call(weights, [], ids)
            return embedded.astype("float32").sum()

        return np.asarray(jax.grad(total)([v.value for v in layer.trainable_variables])[0])
    if backend == "torch":
        layer(ids).float().sum().backward()
        return layer.embeddings.value.grad.numpy()
    import tensorflow as tf

    with tf.GradientTape() as tape:
        total = tf.reduce_sum(tf.cast(layer(ids), "float32"))
    return tf.convert_to_tensor(tape.gradient(total, layer.embeddings.value)).numpy()


def test_a_frequent_tokens_embedding_gradient_sums_in_float32_under_mixed_precision():
    """A token that fills a batch gets one gradient row per occurrence; in
    bfloat16 their sum stalls at 512 here (torch summed so before), where
    float32 sums 3,000 rows of sqrt(d_model) = 2 exactly. The embeddings
    still come out in the compute dtype."""
    layer = TokenEmbedding(vocabulary_size=10, d_model=4, dtype="mixed_bfloat16")
    ids = np.full((1, 3000), 5, "int32")
    assert keras.backend.standardize_dtype(layer(ids).dtype) == "bfloat16"
    gradient = embedding_gradient(layer, ids)
    assert gradient.dtype == np.float32
    np.testing.assert_array_equal(gradient[5], np.full(4, 3000 * 2.0, "float32"))
    np.testing.assert_array_equal(np.delete(gradient, 5, axis=0), 0)


def test_feed_forward_is_relu_between_two_linear_maps(rng):
    layer = PositionwiseFeedForward(d_ff=32)
    x = rng.normal(size=(B, S, D)).astype("float32")
    output = to_numpy(layer(x))
    w1, b1 = (to_numpy(v) for v in (layer.inner_dense.kernel, layer.inner_dense.bias))
    w2, b2 = (to_numpy(v) for v in (layer.outer_dense.kernel, layer.outer_dense.bias))
    layer.inner_dense.bias.assign(rng.normal(size=b1.shape).astype("float32"))
    b1 = to_numpy(layer.inner_dense.bias)
    output = to_numpy(layer(x))
    np.testing.assert_allclose(
        output, np.maximum(0.0, x @ w1 + b1) @ w2 + b2, atol=1e-5
    )
    # Each position is transformed alone: permuting positions permutes outputs.
    np.testing.assert_allclose(
        to_numpy(layer(x[:, ::-1])), output[:, ::-1], atol=1e-5
    )


def _block(cls, normalize_first):
    return cls(num_heads=4, d_ff=32, dropout=0.0, normalize_first=normalize_first)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_ignores_padded_positions(rng, normalize_first):
    block = _block(TransformerEncoderBlock, normalize_first)
    x = rng.normal(size=(B, S, D)).astype("float32")
    padding_mask = np.ones((B, S), bool)
    padding_mask[0, 4:] = False
    padding_mask[1, 2:] = False
    output = to_numpy(block(x, padding_mask=padding_mask))
    perturbed = x + 10.0 * rng.normal(size=x.shape).astype("float32") * ~padding_mask[..., None]
    perturbed_output = to_numpy(block(perturbed, padding_mask=padding_mask))
    np.testing.assert_allclose(
        perturbed_output[padding_mask], output[padding_mask], atol=1e-5
    )
    # Without the mask the perturbation does reach the real positions.
    unmasked = to_numpy(block(perturbed))
    assert np.abs(unmasked[padding_mask] - output[padding_mask]).max() > 1e-2


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_does_not_see_future_positions(rng, normalize_first):
    block = _block(TransformerDecoderBlock, normalize_first)
    x = rng.normal(size=(B, T, D)).astype("float32")
    encoder_output = rng.normal(size=(B, S, D)).astype("float32")
    output = to_numpy(block(x, encoder_output))
    for i in range(T - 1):
        perturbed = x.copy()
        perturbed[:, i + 1 :] += 10.0 * rng.normal(size=perturbed[:, i + 1 :].shape)
        perturbed_output = to_numpy(block(perturbed, encoder_output))
        np.testing.assert_allclose(perturbed_output[:, : i + 1], output[:, : i + 1], atol=1e-5)
        assert np.abs(perturbed_output[:, i + 1 :] - output[:, i + 1 :]).max() > 1e-2


def test_decoder_ignores_padded_encoder_positions(rng):
    block = _block(TransformerDecoderBlock, False)
    x = rng.normal(size=(B, T, D)).astype("float32")
    encoder_output = rng.normal(size=(B, S, D)).astype("float32")
    encoder_padding_mask = np.ones((B, S), bool)
    encoder_padding_mask[:, 3:] = False
    output = to_numpy(
        block(x, encoder_output, encoder_padding_mask=encoder_padding_mask)
    )
    perturbed = encoder_output.copy()
    perturbed[:, 3:] = 100.0
    np.testing.assert_allclose(
        to_numpy(block(x, perturbed, encoder_padding_mask=encoder_padding_mask)),
        output,
        atol=1e-5,
    )


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_cache_equals_full_recomputation(rng, normalize_first):
    block = _block(TransformerDecoderBlock, normalize_first)
    x = rng.normal(size=(B, T, D)).astype("float32")
    encoder_output = rng.normal(size=(B, S, D)).astype("float32")
    encoder_padding_mask = np.ones((B, S), bool)
    encoder_padding_mask[1, 4:] = False
    full = to_numpy(
        block(x, encoder_output, encoder_padding_mask=encoder_padding_mask)
    )
    empty = np.zeros((B, 4, T, D // 4), "float32")  # [B, N, T, head_dim]
    self_cache = (empty, empty)
    cross_cache = block.compute_cross_attention_cache(encoder_output)
    for t in range(T):
        step, self_cache = block(
            x[:, t : t + 1],
            encoder_padding_mask=encoder_padding_mask,
            self_attention_cache=self_cache,
            self_attention_cache_update_index=t,
            cross_attention_cache=cross_cache,
        )
        np.testing.assert_allclose(to_numpy(step)[:, 0], full[:, t], atol=1e-5)


def test_beams_sharing_one_cross_attention_cache_equal_full_recomputation(rng):
    """K beams per sentence read one copy of the source's keys and values."""
    K = 3
    block = _block(TransformerDecoderBlock, False)
    x = rng.normal(size=(B * K, T, D)).astype("float32")  # row b * K + k
    encoder_output = rng.normal(size=(B, S, D)).astype("float32")
    encoder_padding_mask = np.ones((B, S), bool)
    encoder_padding_mask[1, 2:] = False
    full, full_scores = (
        to_numpy(y)
        for y in block(
            x,
            np.repeat(encoder_output, K, axis=0),
            encoder_padding_mask=np.repeat(encoder_padding_mask, K, axis=0),
            return_cross_attention_scores=True,
        )
    )
    empty = np.zeros((B * K, 4, T, D // 4), "float32")
    self_cache = (empty, empty)
    shared = block.compute_cross_attention_cache(encoder_output)  # [B, ...]
    for t in range(T):
        step, scores, self_cache = block(
            x[:, t : t + 1],
            encoder_padding_mask=encoder_padding_mask,
            self_attention_cache=self_cache,
            self_attention_cache_update_index=t,
            cross_attention_cache=shared,
            return_cross_attention_scores=True,
        )
        np.testing.assert_allclose(to_numpy(step)[:, 0], full[:, t], atol=1e-5)
        np.testing.assert_allclose(
            to_numpy(scores)[:, :, 0], full_scores[:, :, t], atol=1e-6
        )
    # The second sentence's beams attend to its 2 real source tokens only.
    assert np.abs(full_scores[K:, :, :, 2:]).max() == 0.0
    with pytest.raises(ValueError, match="batch 4 and a cross-attention cache of batch 3"):
        block(
            x[:4, :1],
            encoder_padding_mask=np.ones((3, S), bool),
            self_attention_cache=(empty[:4], empty[:4]),
            self_attention_cache_update_index=0,
            cross_attention_cache=block.compute_cross_attention_cache(
                np.concatenate([encoder_output, encoder_output[:1]])
            ),
        )


def test_post_ln_output_is_normalized_and_pre_ln_is_not(rng):
    """Post-LN ends on LayerNorm(x + Sublayer(x)); pre-LN on a residual sum."""
    x = 3.0 + 5.0 * rng.normal(size=(B, S, D)).astype("float32")
    post = to_numpy(_block(TransformerEncoderBlock, False)(x))
    np.testing.assert_allclose(post.mean(-1), 0.0, atol=1e-4)
    np.testing.assert_allclose(post.std(-1), 1.0, atol=1e-3)
    pre = to_numpy(_block(TransformerEncoderBlock, True)(x))
    # A residual sum keeps the input's spread (about 5), not unit variance.
    assert np.abs(pre.std(-1) - 1.0).min() > 1.0


def test_residual_dropout_acts_only_in_training(rng):
    block = TransformerEncoderBlock(num_heads=4, d_ff=32, dropout=0.5)
    x = rng.normal(size=(B, S, D)).astype("float32")
    inference = to_numpy(block(x))
    np.testing.assert_allclose(to_numpy(block(x, training=False)), inference, atol=1e-6)
    assert np.abs(to_numpy(block(x, training=True)) - inference).max() > 1e-2


def test_decoder_needs_the_encoder():
    block = _block(TransformerDecoderBlock, False)
    with pytest.raises(ValueError, match="encoder_output=None"):
        block(np.zeros((1, 2, D), "float32"))
