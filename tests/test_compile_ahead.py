"""Under JAX, `fit` on `TokenBatches` compiles its steps for every batch
shape it will meet at once, before the first step (backend/jax_steps.py)."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data import TokenBatches
from keras_transformer.training import compile_model

from test_data_batches import pairs  # noqa: F401 (a fixture: 500 pairs, 400 pieces)

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="compiling ahead is for Keras's JAX trainer, which jits a step per batch shape (backend/jax_steps.py); "
    "torch's steps run eagerly, and TensorFlow's batches keep their lengths free",
)


def tiny_model():
    keras.utils.set_random_seed(0)
    return compile_model(kt.build_transformer("tiny", vocabulary_size=400, num_layers=1), warmup_steps=5)


class PlainBatches(keras.utils.PyDataset):
    """The same batches, as a dataset whose shapes `fit` cannot know ahead."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def __getitem__(self, index):
        return self.batches[index]

    @property
    def num_batches(self):
        return None


def compiles_while(fit):
    """Each compilation of a train or test step that `fit(callback)` makes,
    as (step, whether a train step had begun)."""
    import jax

    compiled, began = [], []

    class Began(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            began.append(batch)

    def listen(event, seconds, fun_name=None, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration" and fun_name in ("jit(train_step)", "jit(test_step)"):
            compiled.append((fun_name[4:-1], bool(began)))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        fit(Began())
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return sorted(compiled)


def test_every_shape_met_is_compiled_before_the_first_step_and_trains_as_keras_s_steps(pairs):
    train = TokenBatches(pairs, 256, buckets=3, repeat=True, seed=1)
    valid = TokenBatches(pairs, 256, buckets=2)
    steps = 6
    met = {train[k][1].shape for k in range(steps)}
    assert len(met) >= 2  # else the test shows nothing
    ahead = tiny_model()
    compiled = compiles_while(
        lambda began: ahead.fit(train, steps_per_epoch=steps, epochs=1, validation_data=valid, callbacks=[began], verbose=0)
    )
    assert compiled == [("test_step", False)] * len(set(valid.lengths)) + [("train_step", False)] * len(met)

    # Keras's own steps compile each shape as its first batch comes (after
    # the step has begun), and train the same weights from the same ones.
    keras_s = tiny_model()
    compiled = compiles_while(
        lambda began: keras_s.fit(
            PlainBatches(train), steps_per_epoch=steps, epochs=1, validation_data=valid, callbacks=[began], verbose=0
        )
    )
    assert compiled == [("test_step", True)] * len(set(valid.lengths)) + [("train_step", True)] * len(met)
    for ours, theirs in zip(ahead.weights, keras_s.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
