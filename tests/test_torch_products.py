"""float32 products through oneDNN under torch (keras_transformer/torch_products.py)."""

import collections

import keras
import numpy as np
import pytest
from conftest import to_numpy

import keras_transformer as kt
from keras_transformer import torch_products

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="torch only: TensorFlow multiplies through oneDNN already, and JAX through XLA; "
    "test_translator.py::test_large_float_products_while_decoding_directly_equal_keras checks "
    "the same products' values on every backend",
)


@pytest.fixture(autouse=True)
def onednn_on_any_cpu(monkeypatch):
    """These tests check oneDNN's path, which the package takes on every CPU
    but an Intel one (`onednn_preferred`); the last test checks that rule."""
    monkeypatch.setattr(torch_products, "onednn_preferred", lambda: True)


def onednn_calls(compute):
    """`compute()`'s result, and how many oneDNN linear operations and
    torch `mm`s it ran, forward and backward."""
    import torch

    with torch.profiler.profile() as profile:
        result = compute()
    calls = collections.Counter(event.name for event in profile.events())
    return result, calls["mkldnn::_linear_pointwise"], calls["aten::mm"]


def gradients_of(model, inputs, weights):
    """The model's logits and the gradients of a fixed random function of
    them with respect to its weights and its float inputs."""
    import torch

    logits = model(inputs, training=False)
    mix = torch.as_tensor(np.random.default_rng(1).normal(size=tuple(logits.shape)).astype("float32"))
    loss = (logits * mix).sum()
    return [logits.detach(), *torch.autograd.grad(loss, weights)]


def test_the_model_s_products_and_gradients_through_onednn_equal_torch_s(monkeypatch):
    """The products in our layers' calls (attention projections, the
    feed-forward layers, the tied output projection) go to oneDNN, forward
    and backward, and the logits and every weight's gradient must equal
    those computed with torch's own products."""
    keras.utils.set_random_seed(0)
    # 4 x 16 target tokens: every projection is 64 x 128 x 128 = 2^20
    # multiply-adds, the smallest that oneDNN takes.
    model = kt.build_transformer(
        "tiny", vocabulary_size=4096, d_model=128, d_ff=512, num_heads=4, num_layers=2, dropout=0.0
    )
    rng = np.random.default_rng(0)
    inputs = {
        "source_ids": rng.integers(4, 4096, (4, 16)).astype("int32"),
        "target_ids": rng.integers(4, 4096, (4, 16)).astype("int32"),
    }
    weights = [v.value for v in model.trainable_variables]

    through_onednn, onednn, _ = onednn_calls(lambda: gradients_of(model, inputs, weights))
    # Forward: 4 attention projections x 3 attention layers, 2 feed-forward
    # products x 4 blocks, the logits: 21; backward: the weights' 21 and the
    # inputs' 20 (not the source's first layer's, whose input is the
    # embedding lookup's: that one is needed too, for the embedding).
    assert onednn >= 21 * 2 + 20

    monkeypatch.setattr(torch_products, "pays", lambda x, kernel: False)
    through_torch, onednn, mm = onednn_calls(lambda: gradients_of(model, inputs, weights))
    assert onednn == 0 and mm > 0
    names = ["logits"] + [v.path for v in model.trainable_variables]
    scale = max(np.abs(to_numpy(b)).max() for b in through_torch[1:])
    for name, a, b in zip(names, through_onednn, through_torch, strict=True):
        # Sums in another order: the tied embedding's gradient adds up
        # thousands of terms, some of which cancel, and the keys' bias has
        # a gradient of zero up to rounding (softmax ignores a shift).
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-4, atol=1e-5 * scale, err_msg=name)


def test_only_the_package_s_layers_change_and_small_products_stay_with_torch():
    """A Keras `Dense` outside our layers keeps Keras's product, and so do
    products under `ONEDNN_MIN_PRODUCT` multiply-adds inside them."""
    import torch

    dense = keras.layers.Dense(512)
    x = torch.randn(64, 128)
    _, onednn, mm = onednn_calls(lambda: dense(x))
    assert (onednn, mm) == (0, 1)

    small = kt.layers.PositionwiseFeedForward(d_ff=32)
    _, onednn, mm = onednn_calls(lambda: small(torch.randn(2, 4, 16)))
    assert (onednn, mm) == (0, 2)

    feed_forward = kt.layers.PositionwiseFeedForward(d_ff=512)
    x = torch.randn(4, 16, 128)
    y, onednn, mm = onednn_calls(lambda: feed_forward(x))
    assert (onednn, mm) == (2, 0)
    inner, outer = feed_forward.inner_dense, feed_forward.outer_dense
    with torch.no_grad():
        expected = torch.relu(x @ inner.kernel.value + inner.bias.value) @ outer.kernel.value + outer.bias.value
    np.testing.assert_allclose(to_numpy(y), to_numpy(expected), rtol=1e-4, atol=1e-5)


def test_a_mixed_bfloat16_layer_keeps_keras_s_products():
    """oneDNN's path is float32 only: under mixed_bfloat16 the products are
    Keras's bfloat16 ones."""
    import torch

    feed_forward = kt.layers.PositionwiseFeedForward(d_ff=512, dtype="mixed_bfloat16")
    y, onednn, _ = onednn_calls(lambda: feed_forward(torch.randn(4, 16, 128)))
    assert onednn == 0
    assert y.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "vendor, mkl, through_onednn",
    [("AuthenticAMD", True, True), ("GenuineIntel", True, False), ("GenuineIntel", False, True), ("", True, True)],
)
def test_on_an_intel_cpu_the_products_stay_with_torch_s_mkl(monkeypatch, vendor, mkl, through_onednn):
    """torch's MKL multiplies as fast as oneDNN or faster on Intel's CPUs
    (torch_products's docstring): there, and only there, the layers'
    products stay torch's, in training and while decoding."""
    import torch

    from keras_transformer import environment
    from keras_transformer.decoding.compiled import _direct_layer_calls

    monkeypatch.undo()  # the rule itself, not the fixture's
    monkeypatch.setattr(environment, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    torch_products.onednn_preferred.cache_clear()
    try:
        assert torch_products.onednn_preferred() is through_onednn
        feed_forward = kt.layers.PositionwiseFeedForward(d_ff=512)
        x = torch.randn(4, 16, 128)
        y, onednn, mm = onednn_calls(lambda: feed_forward(x))
        assert (onednn, mm) == ((2, 0) if through_onednn else (0, 2))
        with torch.no_grad(), _direct_layer_calls():
            decoded, onednn, mm = onednn_calls(lambda: feed_forward(x))
        assert (onednn, mm) == ((2, 0) if through_onednn else (0, 2))
        np.testing.assert_allclose(to_numpy(decoded), to_numpy(y), rtol=1e-5, atol=1e-5)
    finally:
        torch_products.onednn_preferred.cache_clear()
