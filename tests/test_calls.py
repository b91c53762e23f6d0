"""Our layers' direct calls in torch's decoding calls
(keras_transformer/layers/calls.py), and what a torch train step launches."""


import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.backend.options import DecodingOptions
from keras_transformer.layers import calls
from keras_transformer.layers.utils import sublayers

V = 40


def batch():
    rng = np.random.default_rng(0)
    source = rng.integers(3, V, (4, 7)).astype("int32")
    target = rng.integers(3, V, (4, 6)).astype("int32")
    source[1, 4:] = 0  # padding, which the masks must keep out
    target[2, 3:] = 0
    return {"source_ids": source, "target_ids": target}, target


def test_a_direct_call_drops_the_arguments_its_call_does_not_take():
    """Keras's Functional passes `training` and `mask` to every layer; the
    direct call passes on only what `call` takes, as `Layer.__call__` does."""

    class Takes(calls.DirectCalls, keras.layers.Layer):
        def call(self, x, training=None):
            self.training = training
            return x

    class TakesAny(calls.DirectCalls, keras.layers.Layer):
        def call(self, x, **kwargs):
            self.kwargs = kwargs
            return x

    takes, takes_any = Takes(), TakesAny()
    takes.build((2,))
    takes_any.build((2,))
    x = np.ones((1, 2), "float32")
    direct = DecodingOptions(direct=True)
    assert takes(x, training=True, mask=None, decoding=direct) is x and takes.training is True
    takes_any(x, training=False, mask=None, decoding=direct)
    assert takes_any.kwargs == {"training": False, "mask": None, "decoding": direct}


def a_step_s_operations(monkeypatch, replaced=None):
    """The names of the torch operations of a train step of a tiny model of
    3 + 3 blocks (after a first step, which builds it), with `replaced`
    `(module, name, value)` set for both steps; and its weights after."""
    from conftest import torch_operations

    keras.utils.set_random_seed(3)
    model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=3, dropout=0.0)
    training.compile_model(model)  # warmup 4000: steps small enough that rounding stays rounding
    x, y = batch()
    with monkeypatch.context() as patch:
        if replaced is not None:
            patch.setattr(*replaced)
        first = model.train_on_batch(x, y)
        with torch_operations() as operations:
            second = model.train_on_batch(x, y)
    model.step_losses = (first, second)  # the steps' own losses, for comparing two ways of a step
    return [operation.__name__ for operation in operations.operations], model


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="only torch's step is eager; TensorFlow and JAX compile the step, and XLA adds each bias inside its product's fusion")
def test_a_torch_step_adds_each_bias_inside_its_product(monkeypatch):
    """Under torch, each projection with a bias is one `addmm` (a kernel
    fewer on a GPU, where a step is bound by the host's launches), not a
    product and an `add`: the same step, to float32 rounding."""
    from keras_transformer.backend import products

    names, model = a_step_s_operations(monkeypatch)
    apart, apart_model = a_step_s_operations(monkeypatch, (products, "biased_product", lambda *args, **kwargs: None))
    biased = [
        layer for layer in sublayers(model) if isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense) and layer.bias is not None
    ]
    # 3 + 3 blocks: 6 projections an encoder block, 10 a decoder block.
    assert len(biased) == 48
    assert (names.count("addmm.default"), apart.count("addmm.default")) == (48, 0)
    assert apart.count("add.Tensor") - names.count("add.Tensor") == 48
    # The loss of both steps, and the weights after: Adam's first steps at
    # warmup 4000 move a weight by about 1e-6, so its rounding stays below.
    np.testing.assert_allclose(model.step_losses, apart_model.step_losses, rtol=1e-5)
    for got, want in zip(model.get_weights(), apart_model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


