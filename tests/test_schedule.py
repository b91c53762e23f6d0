import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.optimizers import Adam, transformer_adam
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


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_updates_as_keras_adam_does(amsgrad):
    """Our Adam (one kernel per variable under TensorFlow, all variables at
    once under torch) against Keras's."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=3).astype("float32")]
    grads = [[rng.normal(size=w.shape).astype("float32") for w in start] for _ in range(5)]

    def trained_with(optimizer_class):
        optimizer = optimizer_class(
            1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9, amsgrad=amsgrad
        )
        variables = [keras.Variable(w) for w in start]
        for step, step_grads in enumerate(grads):
            if step == 2:  # as a restored checkpoint does: in place
                variables[0].assign(start[0] * 2)
            # The first gradient as autograd gives a kernel's that was used
            # transposed: under torch, a view whose memory is in another order.
            first = keras.ops.transpose(keras.ops.convert_to_tensor(np.ascontiguousarray(step_grads[0].T)))
            # A step without the second variable's gradient, then with it.
            pairs = list(zip([first, keras.ops.convert_to_tensor(step_grads[1])], variables))
            optimizer.apply_gradients(pairs[:1] if step == 3 else pairs)
        return [to_numpy(v) for v in variables]

    ours, reference = trained_with(Adam), trained_with(keras.optimizers.Adam)
    assert not np.allclose(ours[0], start[0])
    for mine, theirs in zip(ours, reference):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


def test_a_model_trains_with_our_adam_as_with_keras_s():
    """The update in a model's steps, on the gradients its backend gives
    (under torch, some of them transposed views): the torch quick start
    trained to 84 BLEU, not 99, while the fused kernel read those in the
    wrong order, and the update of plain tensors above was right."""
    inputs, labels = kt.data.reversal_task(64, 16, seed=0)

    def trained_with(optimizer_class):
        keras.utils.set_random_seed(0)
        # A vocabulary over d_model: then torch's gradient of the shared
        # embedding is a transposed view.
        model = kt.build_transformer("tiny", vocabulary_size=400, num_layers=1, dropout=0.0)
        model.compile(
            optimizer=optimizer_class(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
            loss=kt.losses.LabelSmoothedCrossEntropy(),
        )
        losses = [
            float(model.train_on_batch({k: v[i : i + 16] for k, v in inputs.items()}, labels[i : i + 16]))
            for i in range(0, 64, 16)
        ]
        return losses, to_numpy(model.source_embedding.embeddings)

    (our_losses, ours), (their_losses, theirs) = trained_with(Adam), trained_with(keras.optimizers.Adam)
    np.testing.assert_allclose(our_losses, their_losses, rtol=2e-4)
    # All but a few embedding weights: where a gradient is within a few
    # orders of epsilon, torch's kernel updates as Adam's paper does, not as
    # Keras does (backend/fused_adam.py).
    assert np.mean(np.abs(ours - theirs) > 1e-4) < 0.01


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the _foreach update is Keras's torch backend's; the update's values are checked on every backend above",
)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_under_torch_adam_updates_all_variables_at_once(amsgrad):
    """One update of many variables runs as one fused Adam kernel (with
    amsgrad, a few `_foreach` operations), not a dozen operations per
    variable (Keras's update for an Adam subclass)."""
    import torch

    variables = [keras.Variable(np.full((3, 2), i, "float32")) for i in range(40)]
    optimizer = transformer_adam(16, warmup_steps=10, amsgrad=amsgrad)
    optimizer.build(variables)
    grads = [keras.ops.ones((3, 2)) for _ in variables]
    with torch.profiler.profile() as profile:
        optimizer.apply_gradients(zip(grads, variables))
    names = [event.name for event in profile.events()]
    if amsgrad:
        assert names.count("aten::_foreach_add_") >= 3
    else:
        assert names.count("aten::_fused_adam_") == 1
        assert names.count("aten::_foreach_mul_") == 0
    # beta_1^t and beta_2^t (and the schedule's powers) once, not per variable.
    assert names.count("aten::pow") < 10
    assert not np.allclose(to_numpy(variables[1]), 1.0)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="Keras's per-variable walks in `apply` are skipped under torch only; the updates' values are checked on every backend above",
)
@pytest.mark.filterwarnings("ignore:Gradients do not exist")
def test_under_torch_adam_applies_as_keras_s_apply_and_keeps_its_checks(monkeypatch):
    """Our `apply` finds once per list of variables what Keras's finds each
    step (each variable known, none constrained or overwritten with its
    gradient) and then updates as Keras's `apply` does, bit for bit; a
    constraint, a missing gradient or an unknown variable take Keras's own
    `apply`, with its behaviour and errors."""
    from keras_transformer.backend import fused_adam

    rng = np.random.default_rng(0)
    start = [rng.normal(size=(4, 3)).astype("float32") for _ in range(3)]
    grads = [[rng.normal(size=w.shape).astype("float32") for w in start] for _ in range(4)]

    def trained(fast, constraint=None):
        if not fast:
            monkeypatch.setattr(fused_adam, "apply", lambda *arguments: False)
        variables = [keras.Variable(w) for w in start]
        variables[2].constraint = constraint
        optimizer = transformer_adam(16, warmup_steps=10)
        optimizer.build(variables)
        checks = []
        check = optimizer._check_variables_are_known
        monkeypatch.setattr(optimizer, "_check_variables_are_known", lambda v: checks.append(1) or check(v))
        for step, step_grads in enumerate(grads):
            tensors = [keras.ops.convert_to_tensor(g) for g in step_grads]
            if step == 2:
                tensors[1] = None  # an unused variable's gradient
            optimizer.apply(tensors, variables)
        monkeypatch.undo()
        assert int(optimizer.iterations.numpy()) == 4
        return [to_numpy(v) for v in variables], len(checks)

    (fast, fast_checks), (keras_s, keras_checks) = trained(True), trained(False)
    for mine, theirs in zip(fast, keras_s):
        np.testing.assert_array_equal(mine, theirs)
    assert (fast_checks, keras_checks) == (2, 4)  # once for the list, once in the step without a gradient
    # A constrained variable: Keras's apply, constraint and all.
    (bounded, _), (bounded_keras, _) = trained(True, keras.constraints.NonNeg()), trained(False, keras.constraints.NonNeg())
    assert bounded[2].min() >= 0 and start[2].min() < 0
    for mine, theirs in zip(bounded, bounded_keras):
        np.testing.assert_array_equal(mine, theirs)
    optimizer = transformer_adam(16, warmup_steps=10)
    optimizer.build([keras.Variable(start[0])])
    with pytest.raises(ValueError, match="Unknown variable"):
        optimizer.apply([keras.ops.ones((4, 3))], [keras.Variable(start[1])])


def test_paper_adam_is_ours_and_round_trips():
    optimizer = keras.optimizers.deserialize(
        keras.optimizers.serialize(transformer_adam(256, 100, clipnorm=1.0))
    )
    assert isinstance(optimizer, Adam) and optimizer.clipnorm == 1.0
