"""The gradient norm of each update, on the logs and TensorBoard: read from
Adam's second moments after a first update, which hold (1 - beta_2) g^2."""

import warnings

import keras
import numpy as np
import pytest
from conftest import in_one_pass

import keras_transformer as kt
from keras_transformer import training

V = 40


def batches(count):
    rng = np.random.default_rng(3)
    ids = rng.integers(3, V, size=(count, 3, 2, 7)).astype("int32")
    return [({"source_ids": batch[0], "target_ids": batch[1]}, batch[1]) for batch in ids]


class Logged(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.norms = []

    def on_train_batch_end(self, batch, logs=None):
        self.norms.append(float(logs["gradient_norm"]))


def first_update_norm(model):
    """|g| of the first update, from its second moments v = (1 - beta_2) g^2."""
    optimizer = model.optimizer
    velocities = [keras.ops.convert_to_numpy(v) for v in optimizer._velocities]
    return float(np.sqrt(sum(float(v.astype("float64").sum()) for v in velocities) / (1 - optimizer.beta_2)))


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_logged_norm_is_the_norm_of_the_update_s_gradient(accumulate):
    keras.utils.set_random_seed(0)
    model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1, dropout=0.0)
    training.compile_model(model, warmup_steps=10, accumulate=accumulate, record_gradient_norm=True)
    logged = Logged()
    for inputs, labels in batches(accumulate):
        model.fit(inputs, labels, batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=[logged])
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1  # updates
    # Before the update's last batch nothing is applied: the norm stays at 0.
    assert logged.norms[:-1] == [0.0] * (accumulate - 1)
    assert logged.norms[-1] == pytest.approx(first_update_norm(model), rel=1e-4)


@in_one_pass("torch", "Keras's weights files, the same under every backend; each backend's norm is tested above")
def test_without_asking_the_logs_are_keras_s_and_saved_files_are_keras_adam_s(tmp_path):
    keras.utils.set_random_seed(0)
    model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1)
    training.compile_model(model, warmup_steps=10)
    (inputs, labels), = batches(1)
    history = model.fit(inputs, labels, batch_size=2, epochs=1, verbose=0)
    assert "gradient_norm" not in history.history
    # The recorded norm is left out of files: Keras's own Adam reads them, and ours reads Keras's.
    model.save_weights(tmp_path / "ours.weights.h5")
    plain = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1)
    settings = {k: v for k, v in model.optimizer.get_config().items() if k != "record_gradient_norm"}
    plain.compile(optimizer=keras.optimizers.Adam.from_config(settings), loss=kt.losses.LabelSmoothedCrossEntropy())
    plain.optimizer.build(plain.trainable_variables)
    assert len(plain.optimizer.variables) == len(model.optimizer.variables) - 1
    with warnings.catch_warnings():
        # Keras warns, and loads nothing, where an optimizer's state does not fit.
        warnings.filterwarnings("error", message=".*[Ss]kipping variable loading")
        plain.load_weights(tmp_path / "ours.weights.h5")
        plain.save_weights(tmp_path / "plain.weights.h5")
        model.load_weights(tmp_path / "plain.weights.h5")
    for ours, keras_s in zip(model.optimizer._velocities, plain.optimizer._velocities, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(keras_s))
    assert int(keras.ops.convert_to_numpy(plain.optimizer.iterations)) == 1


def test_a_keras_without_the_clipping_hook_is_told_once(monkeypatch):
    """`keras_private.UpdateGradients` overrides Keras's private
    `_clip_gradients`: where a Keras has none, asking for the norm warns,
    once, and training goes on without it."""
    from keras_transformer.backend import keras_private

    monkeypatch.setattr(keras_private, "_has_update_gradients_hook", lambda: False)
    monkeypatch.delitem(keras_private._found, "update_gradients", raising=False)
    variables = [keras.Variable(np.ones((2, 3), "float32"))]
    with pytest.warns(RuntimeWarning, match="have no _clip_gradients.*no gradient norm is logged") as told:
        kt.optimizers.transformer_adam(64, 10, record_gradient_norm=True).build(variables)
        kt.optimizers.transformer_adam(64, 10, record_gradient_norm=True).build(variables)
    assert len([w for w in told if issubclass(w.category, RuntimeWarning)]) == 1
