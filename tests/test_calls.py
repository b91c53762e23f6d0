"""Our layers' direct calls in torch's train, test and predict steps
(keras_transformer/layers/calls.py, backend/state.py's `direct_steps`)."""

import contextlib
import types

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.backend import state
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


def trained(dtype, direct, monkeypatch, dropout=0.3, regularizer=None):
    """Weights, logs (loss and metrics) and predictions after 3 train steps
    of a tiny model, with our layers' direct calls in its steps or through
    `Layer.__call__`; `regularizer` on its first weight."""
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(state, "direct_steps", lambda compiled=False: contextlib.nullcontext())
        keras.utils.set_random_seed(3)
        model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1, dropout=dropout, attention_dropout=0.1, dtype=dtype)
        training.compile_model(model, warmup_steps=2)
        model.trainable_weights[0].regularizer = regularizer
        x, y = batch()
        calls._call_arguments.cache_clear()
        losses = [model.train_on_batch(x, y, return_dict=True) for _ in range(3)]
        predictions = model.predict_on_batch(x)
        direct_calls = calls._call_arguments.cache_info().hits + calls._call_arguments.cache_info().misses
    return model.get_weights(), losses, predictions, direct_calls


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="direct calls in steps are torch's; TensorFlow and JAX trace a step once, through Keras's calls",
)
@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_a_step_of_direct_calls_trains_as_keras_s_calls_do(dtype, monkeypatch):
    """Under torch, our layers run their `call` directly in each step: the
    same weights, losses and predictions, bit for bit, as through
    `Layer.__call__`, dropout streams and bfloat16 casts included."""
    weights, losses, predictions, direct_calls = trained(dtype, True, monkeypatch)
    keras_weights, keras_losses, keras_predictions, keras_direct_calls = trained(dtype, False, monkeypatch)
    assert direct_calls > 0 and keras_direct_calls == 0
    assert losses == keras_losses
    np.testing.assert_array_equal(predictions, keras_predictions)
    for got, want in zip(weights, keras_weights):
        np.testing.assert_array_equal(got, want)
    assert {"loss", "masked_token_accuracy", "perplexity"} <= losses[0].keys()  # the metrics compared too
    # Dropout acted in those steps: without it the weights differ.
    plain_weights = trained(dtype, True, monkeypatch, dropout=0.0)[0]
    assert any(not np.array_equal(a, b) for a, b in zip(plain_weights, weights))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="direct calls in steps are torch's; TensorFlow and JAX trace a step once, through Keras's calls")
def test_a_regularizer_adds_to_a_direct_step_s_loss_as_to_keras_s(monkeypatch):
    """A weight's regularizer adds its penalty to a step of direct calls, as
    through `Layer.__call__`."""
    penalty = keras.regularizers.L2(0.5)
    weights, logs, _, _ = trained("float32", True, monkeypatch, regularizer=penalty)
    keras_weights, keras_logs, _, _ = trained("float32", False, monkeypatch, regularizer=penalty)
    assert logs == keras_logs
    for got, want in zip(weights, keras_weights):
        np.testing.assert_array_equal(got, want)
    plain_logs = trained("float32", True, monkeypatch)[1]
    assert logs[0]["loss"] > plain_logs[0]["loss"]


def test_steps_call_our_layers_directly_only_under_torch_uncompiled():
    """Every backend: a step's context opens direct calls under torch, and
    neither under TensorFlow and JAX, whose steps are traced, nor for a
    step that torch compiles."""
    assert not state.direct()
    with state.direct_steps():
        assert state.direct() == (keras.backend.backend() == "torch")
    with state.direct_steps(compiled=True):
        assert not state.direct()
    assert not state.direct()


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
    with state.decoding_call(direct=True):
        assert takes(x, training=True, mask=None) is x and takes.training is True
        takes_any(x, training=False, mask=None)
        assert takes_any.kwargs == {"training": False, "mask": None}


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


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the memo is for torch's eager step; TensorFlow and JAX trace a step once, and the compiler merges the layers' identical mask computations")
def test_a_torch_step_derives_each_stack_s_attention_mask_once(monkeypatch):
    """In a torch train step, the attention layers of a stack get the same
    masks and derive their merged, additive and no-key masks from them once
    a step, not once a layer: the same weights after the step."""

    def step(memo):
        names, model = a_step_s_operations(monkeypatch, None if memo else (state, "step_memo", contextlib.nullcontext))
        return names.count("any.dim"), model.get_weights()

    once, weights = step(True)
    per_layer, per_layer_weights = step(False)
    # Nine attention layers, three masks (the encoder's self-attention, the
    # decoder's, the cross-attention): one `any` a derivation, 9 -> 3.
    assert per_layer - once == 9 - 3, (once, per_layer)
    for got, want in zip(weights, per_layer_weights):
        np.testing.assert_array_equal(got, want)
    assert state.memoized("kind", (1,), lambda: []) is not state.memoized("kind", (1,), lambda: [])  # no memo outside a step


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's step runs its metrics eagerly; TensorFlow and JAX trace them into the step, where the compiler merges the masks")
def test_a_torch_step_s_metrics_share_one_mask(monkeypatch):
    """Our token metrics derive the non-padding mask and its sum once a
    torch step for all of them: the same results as each on its own."""
    from keras_transformer import metrics

    def step(replaced=None):
        names, model = a_step_s_operations(monkeypatch, replaced)
        return names, {name: float(value) for name, value in model.get_metrics_result().items()}

    names, results = step()
    unshared, unshared_results = step((metrics, "state", types.SimpleNamespace(memoized=lambda kind, inputs, make: make())))
    # Three metrics, each deriving the mask (`ne`) and summing it: one of each.
    assert unshared.count("ne.Tensor") - names.count("ne.Tensor") == 2
    assert unshared.count("sum.default") - names.count("sum.default") == 2
    assert results == unshared_results
    assert set(results) >= {"masked_token_accuracy", "perplexity", "target_tokens"}
