"""A converted model is made from its values (layers/initial_values.py):
every weight takes its value as it is made, nothing is drawn at random
first, and a value that does not fit is told after the build
(convert/pipeline.py's `check`)."""

import contextlib

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.backend import layouts
from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.convert.pipeline import check
from keras_transformer.layers.initial_values import initial_values

OPTIONS = {"vocabulary_size": 40, "num_layers": 1, "d_model": 16, "d_ff": 32, "num_heads": 2}


def random_values():
    """A value for every weight of a model of OPTIONS, by path."""
    rng = np.random.default_rng(0)
    return {weight.path: rng.standard_normal(weight.shape).astype("float32")
            for weight in kt.Transformer(**OPTIONS).weights}


def refuse_random_draws(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an initializer drew random values")

    for initializer in (keras.initializers.RandomNormal, keras.initializers.VarianceScaling):
        monkeypatch.setattr(initializer, "__call__", refuse)


@pytest.mark.parametrize("order", ["keras", "linear"])
def test_a_model_made_from_values_holds_them_and_draws_nothing(order, monkeypatch):
    values = random_values()
    refuse_random_draws(monkeypatch)
    with pytest.raises(AssertionError, match="drew random values"):
        kt.Transformer(**OPTIONS)
    calls = []

    def read(path):
        calls.append(path)
        return values[path]

    # Half arrays, half functions that read them (`Tensors.later`).
    given_values = {path: (lambda path=path: read(path)) if i % 2 else value for i, (path, value) in
                    enumerate(values.items())}
    # Under torch, linear_order lays the kernels in torch's order: the values are the same.
    with layouts.linear_order() if order == "linear" else contextlib.nullcontext():
        with initial_values(given_values) as given:
            model = kt.Transformer(**OPTIONS)
    assert given.error is None and given.values == {} and given.paths == set(values)
    assert sorted(calls) == sorted(set(calls)) and len(calls) == len(values) // 2
    for weight in model.weights:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(weight), values[weight.path])
    check(model, given, "checkpoint")
    if keras.backend.backend() == "torch":
        kernel = next(w for w in model.weights if w.path == "encoder_block_0/feed_forward/inner_dense/kernel")
        assert layouts.in_linear_order(kernel.value) == (order == "linear")


def test_a_value_that_does_not_fit_is_told_after_the_build():
    values = random_values()
    values["token_embedding/embeddings"] = np.zeros((3, 16), "float32")
    with initial_values(values) as given:
        kt.Transformer(**OPTIONS)  # no error inside Keras's build
    with pytest.raises(ValueError, match=r"token_embedding/embeddings has shape \(3, 16\); expected \(40, 16\)"):
        raise given.error

    def unreadable():
        raise ConversionError("checkpoint: the tensor 'lm_head.weight' cannot be read (truncated).")

    values = random_values() | {"encoder_block_0/self_attention/query/kernel": unreadable}
    with initial_values(values) as given:
        model = kt.Transformer(**OPTIONS)
    with pytest.raises(ConversionError, match="^checkpoint: the tensor 'lm_head.weight' cannot be read"):
        check(model, given, "checkpoint")


def test_a_missing_or_unknown_value_is_an_error_naming_it():
    values = random_values()
    del values["decoder_block_0/feed_forward/outer_dense/bias"]
    with initial_values(values) as given:
        model = kt.Transformer(**OPTIONS)
    with pytest.raises(ConversionError, match="gave no value for decoder_block_0/feed_forward/outer_dense/bias"):
        check(model, given, "checkpoint")
    values = random_values() | {"decoder_block_7/extra/kernel": np.zeros(2)}
    with initial_values(values) as given:
        model = kt.Transformer(**OPTIONS)
    with pytest.raises(ConversionError, match="gave decoder_block_7/extra/kernel, which the model does not have"):
        check(model, given, "checkpoint")
