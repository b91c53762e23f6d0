"""Our layers' direct calls in torch's train, test and predict steps
(keras_transformer/layers/calls.py, backend/state.py's `direct_steps`)."""

import contextlib

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.backend import state
from keras_transformer.layers import calls

V = 40


def batch():
    rng = np.random.default_rng(0)
    source = rng.integers(3, V, (4, 7)).astype("int32")
    target = rng.integers(3, V, (4, 6)).astype("int32")
    source[1, 4:] = 0  # padding, which the masks must keep out
    target[2, 3:] = 0
    return {"source_ids": source, "target_ids": target}, target


def trained(dtype, direct, monkeypatch, dropout=0.3):
    """Weights, loss and predictions after 3 train steps of a tiny model,
    with our layers' direct calls in its steps or through `Layer.__call__`."""
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(state, "direct_steps", lambda compiled=False: contextlib.nullcontext())
        keras.utils.set_random_seed(3)
        model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1, dropout=dropout, attention_dropout=0.1, dtype=dtype)
        training.compile_model(model, warmup_steps=2)
        x, y = batch()
        calls._call_arguments.cache_clear()
        losses = [model.train_on_batch(x, y)[0] for _ in range(3)]
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
    # Dropout acted in those steps: without it the weights differ.
    plain_weights = trained(dtype, True, monkeypatch, dropout=0.0)[0]
    assert any(not np.array_equal(a, b) for a, b in zip(plain_weights, weights))


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


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="TensorFlow and JAX trace the train step once, so Keras lists the variables once there already; only torch's step is ours")
def test_a_torch_fit_lists_its_variables_once_and_leaves_no_gradients(monkeypatch):
    """Under torch, `fit` lists the trainable variables once for all its
    steps (Keras's step walks the model's layers for them twice a step),
    and the steps take their gradients without leaving them on the weights
    for the next step to clear."""
    from keras_transformer.backend import torch_step

    listings = []
    listed = torch_step.listed
    monkeypatch.setattr(torch_step, "listed", lambda variables: listings.append(1) or listed(variables))
    keras.utils.set_random_seed(3)
    model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1)
    training.compile_model(model, warmup_steps=2)
    before = [w.copy() for w in model.get_weights()]
    x, y = batch()
    model.fit({key: np.repeat(value, 3, axis=0) for key, value in x.items()}, np.repeat(y, 3, axis=0), batch_size=4, epochs=1, verbose=0)
    assert model.optimizer.iterations.numpy() == 3
    assert len(listings) == 1
    assert all(variable.value.grad is None for variable in model.trainable_weights)
    assert all(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
