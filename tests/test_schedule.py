import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.optimizers import transformer_adam
from keras_transformer.schedules import TransformerSchedule

from conftest import to_numpy


def paper_rate(step_num, d_model=512, warmup_steps=4000):
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


@pytest.mark.parametrize("step_num", [1, 4000, 100000])
def test_matches_the_formula(step_num):
    schedule = TransformerSchedule(d_model=512)
    # The optimizer's update `iterations` is the paper's step_num - 1.
    rate = float(to_numpy(schedule(step_num - 1)))
    assert rate == pytest.approx(paper_rate(step_num), rel=1e-6)


def test_peaks_at_the_warmup_step():
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    iterations = np.arange(0, 20000)
    rates = to_numpy(schedule(keras.ops.convert_to_tensor(iterations)))
    assert int(np.argmax(rates)) + 1 == 4000
    assert np.all(np.diff(rates[:3999]) > 0) and np.all(np.diff(rates[3999:]) < 0)
    np.testing.assert_allclose(rates, [paper_rate(i + 1) for i in iterations], rtol=1e-5)


def test_paper_adam_takes_its_first_step_at_step_num_1():
    optimizer = transformer_adam(d_model=64, warmup_steps=10)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    variable = keras.Variable(np.zeros(3, "float32"))
    optimizer.build([variable])
    assert float(to_numpy(optimizer.learning_rate)) == pytest.approx(
        paper_rate(1, 64, 10), rel=1e-6
    )
    # Adam's first update moves each weight by the learning rate itself.
    optimizer.apply_gradients([(keras.ops.convert_to_tensor([0.5, -2.0, 3.0]), variable)])
    np.testing.assert_allclose(
        to_numpy(variable), -np.sign([0.5, -2.0, 3.0]) * paper_rate(1, 64, 10), rtol=1e-4
    )
    assert float(to_numpy(optimizer.learning_rate)) == pytest.approx(
        paper_rate(2, 64, 10), rel=1e-6
    )


def test_round_trips_through_config_and_the_optimizer():
    schedule = TransformerSchedule(d_model=256, warmup_steps=100)
    clone = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert isinstance(clone, TransformerSchedule)
    assert (clone.d_model, clone.warmup_steps) == (256, 100)
    optimizer = keras.optimizers.deserialize(
        keras.optimizers.serialize(transformer_adam(256, 100))
    )
    assert float(to_numpy(optimizer.learning_rate)) == pytest.approx(paper_rate(1, 256, 100))


@pytest.mark.parametrize("step_num", [1, 100, 5000])
def test_a_scale_multiplies_the_formula(step_num):
    schedule = TransformerSchedule(d_model=256, warmup_steps=100, scale=2.5)
    rate = float(to_numpy(schedule(step_num - 1)))
    assert rate == pytest.approx(2.5 * paper_rate(step_num, 256, 100), rel=1e-6)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert clone.scale == 2.5
    optimizer = transformer_adam(256, 100, learning_rate_scale=2.5)
    optimizer.build([keras.Variable(np.zeros(3, "float32"))])
    assert float(to_numpy(optimizer.learning_rate)) == pytest.approx(2.5 * paper_rate(1, 256, 100), rel=1e-6)


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"d_model": 0}, "d_model=0"),
        ({"d_model": 512, "warmup_steps": -1}, "warmup_steps=-1"),
        ({"d_model": 512, "scale": float("nan")}, "scale=nan"),
        ({"d_model": 512, "scale": float("inf")}, "scale=inf"),
    ],
)
def test_rejects_non_positive_arguments(arguments, named):
    with pytest.raises(ValueError, match=f"must be a positive finite number. Received: {named}"):
        TransformerSchedule(**arguments)


# One step of the paper's Adam (t = 1), in float64: m = (1 - b1) g,
# v = (1 - b2) g^2, w - lr sqrt(1 - b2) / (1 - b1) m / (sqrt(v) + eps).
def adam_step_reference(weights, gradients, rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9):
    weights, gradients = np.float64(weights), np.float64(gradients)
    m, v = (1 - beta_1) * gradients, (1 - beta_2) * gradients**2
    return weights - rate * np.sqrt(1 - beta_2) / (1 - beta_1) * m / (np.sqrt(v) + epsilon)


def test_one_adam_step_gives_the_same_weights_on_every_backend():
    """The paper's Adam, one step on fixed gradients, against its formula in
    float64: within 1e-6 here means within 2e-6 of any other backend's. The
    gradients span 1e-12 to 1, where epsilon (1e-9) matters and where it
    does not; the rate is the schedule's at step 1, scaled up to 1e-2."""
    rng = np.random.default_rng(0)
    magnitudes = 10.0 ** rng.integers(-12, 1, size=(64, 48))
    gradients = (rng.normal(size=(64, 48)) * magnitudes).astype("float32")
    weights = rng.normal(size=(64, 48)).astype("float32")
    optimizer = transformer_adam(256, warmup_steps=100, learning_rate_scale=1e-2 / paper_rate(1, 256, 100))
    variable = keras.Variable(weights)
    optimizer.build([variable])
    optimizer.apply([keras.ops.convert_to_tensor(gradients)], [variable])
    expected = adam_step_reference(weights, np.float64(gradients), 1e-2)
    np.testing.assert_allclose(to_numpy(variable), expected, rtol=0, atol=1e-6)
    assert np.abs(to_numpy(variable) - weights).max() > 1e-3


def test_paper_adam_is_ours_and_round_trips():
    optimizer = keras.optimizers.deserialize(
        keras.optimizers.serialize(transformer_adam(256, 100, clipnorm=1.0))
    )
    assert type(optimizer) is kt.optimizers.Adam and optimizer.clipnorm == 1.0
    assert isinstance(optimizer.get_config()["learning_rate"], dict)
    schedule = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    assert isinstance(schedule, TransformerSchedule) and schedule.d_model == 256


def _five_adam_steps(optimizer, shapes, seed=0):
    """The weights after five `apply`s of random gradients from 1e-12 to 1."""
    rng = np.random.default_rng(seed)
    variables = [keras.Variable(rng.normal(size=shape).astype("float32")) for shape in shapes]
    optimizer.build(variables)
    # Each variable once (JAX's steps donate their buffers, a saved file
    # holds each): the step count and two moments per weight, and ours the
    # last update's gradient norm.
    ours = isinstance(optimizer, kt.optimizers.Adam)
    assert len({id(v) for v in optimizer.variables}) == len(optimizer.variables) == 1 + 2 * len(shapes) + ours
    for _ in range(5):
        gradients = [
            (rng.normal(size=shape) * 10.0 ** rng.integers(-12, 1, size=shape)).astype("float32")
            for shape in shapes
        ]
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in gradients], variables)
    return [to_numpy(v) for v in variables]


@pytest.mark.parametrize("clipnorm", [None, 1.0])
def test_ours_updates_as_keras_s_adam_and_under_torch_in_torch_s_fused_kernel(monkeypatch, clipnorm):
    """Under torch our Adam's update runs in torch's fused kernel, where
    Keras's `apply` would only update (not when clipping): it must take
    the same steps as Keras's Adam."""
    fused = []
    update = kt.optimizers._fused_update
    monkeypatch.setattr(kt.optimizers, "_fused_update", lambda *a: (fused.append(1), update(*a)))
    shapes = [(64, 48), (48,)]
    schedule = TransformerSchedule(256, 100, 50.0)
    ours = _five_adam_steps(transformer_adam(256, 100, learning_rate_scale=50.0, clipnorm=clipnorm), shapes)
    keras_s = _five_adam_steps(
        keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9, clipnorm=clipnorm), shapes
    )
    for a, b in zip(ours, keras_s):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert len(fused) == (5 if keras.backend.backend() == "torch" and clipnorm is None else 0)
