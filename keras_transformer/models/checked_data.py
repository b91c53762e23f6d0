"""Keras's training and inference entry points, with the data checked where
it enters.

`Transformer` takes its inputs' ids from `fit`, `evaluate`, `predict` and
the batch methods checked against its vocabulary: on the host where the
data allows it (under JAX the compiled steps then leave the id callback
out), in the data pipeline or in the model otherwise. Its steps are
Keras's own (`train_step`, `test_step`, `predict_step`), told where the
ids were checked (`_step_context`).
"""

import contextlib

import keras

from keras_transformer.checks import check_ids_on_host
from keras_transformer.checks import check_model_data
from keras_transformer.checks import ids_checked_on_host
from keras_transformer.data.batches import TokenBatches


class CheckedData:
    """The entry points of a `keras.Model` that check `x` first."""

    # Which compiled functions were traced for data whose ids were checked
    # on the host (JAX only; see `_checked_data`).
    _steps_without_id_check = frozenset()

    def fit(self, x=None, *args, **kwargs):
        if isinstance(x, TokenBatches) and len(args) < 8:  # `shuffle` not given by position
            # Its batches are shuffled by the dataset itself (its `shuffle`),
            # which Keras's default `shuffle=True` would warn that it ignores.
            kwargs.setdefault("shuffle", False)
        x = self._checked_data(x, "train_function")
        if "validation_data" in kwargs:
            kwargs["validation_data"] = _as_tf_dataset_under_tensorflow(kwargs["validation_data"])
        self._build_optimizer()
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        return super().evaluate(self._checked_data(x, "test_function"), *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        """Keras's `predict`. Batches of several lengths, such as a
        `TokenBatches`' buckets (`make_dataset`), come back as one array
        all the same: each batch's outputs are padded with zeros after its
        last position to the longest batch's length, `[rows, longest,
        vocabulary_size]`, the rows in the dataset's order (batch k's are
        `dataset.pair_indices(k)`, then its rows of padding)."""
        self._pad_predictions_to(x.longest if isinstance(x, TokenBatches) else None)
        return super().predict(self._checked_data(x, "predict_function"), *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        x = self._checked_data(x, "train_function")
        self._build_optimizer()
        return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        return super().test_on_batch(self._checked_data(x, "test_function"), *args, **kwargs)

    def predict_on_batch(self, x):
        return super().predict_on_batch(self._checked_data(x, "predict_function"))

    # The steps Keras compiles: under JAX they leave the id check out where
    # the data was checked on the host (checks.check_ids_on_host).
    def train_step(self, *args, **kwargs):
        with self._step_context("train_function"):
            outputs = super().train_step(*args, **kwargs)
        return _with_gradient_norm(self.optimizer, outputs)

    def test_step(self, *args, **kwargs):
        with self._step_context("test_function"):
            return super().test_step(*args, **kwargs)

    def predict_step(self, *args, **kwargs):
        with self._step_context("predict_function"):
            outputs = super().predict_step(*args, **kwargs)
        if keras.backend.backend() == "jax":  # JAX's step returns its state too
            logits, state = outputs
            return self._padded_predictions(logits), state
        return self._padded_predictions(outputs)

    def _padded_predictions(self, logits):
        if self._predictions_length is None:
            return logits
        padding = self._predictions_length - keras.ops.shape(logits)[1]
        return keras.ops.pad(logits, [[0, 0], [0, padding], [0, 0]])

    # The length `predict_step` pads its outputs to, or None.
    _predictions_length = None

    def _pad_predictions_to(self, length):
        if length != self._predictions_length:
            self._predictions_length = length
            self.predict_function = None  # traced with the old length: Keras makes it again

    def _step_context(self, function):
        return ids_checked_on_host(function in self._steps_without_id_check)

    def _checked_data(self, x, function):
        """Checks `x` for `function`'s steps, and remakes that compiled
        function if it was traced for data checked elsewhere."""
        x = _as_tf_dataset_under_tensorflow(x)
        x = check_model_data(x, self.vocabulary_size)
        x, on_host = check_ids_on_host(x, self.vocabulary_size)
        made_for_host_checks = function in self._steps_without_id_check
        if made_for_host_checks != on_host and getattr(self, function, None) is not None:
            setattr(self, function, None)  # Keras makes it again, traced anew
        if on_host:
            self._steps_without_id_check = self._steps_without_id_check | {function}
        else:
            self._steps_without_id_check = self._steps_without_id_check - {function}
        return x

    def _build_optimizer(self):
        """Creates the optimizer's variables before the first train step.

        Keras's TensorFlow trainer leaves them to the first traced step, and
        variables created while tracing make `tf.function` trace the step a
        second time: about half of a first step's time on a CPU. Keras builds
        them first itself under JAX and torch, and under a `tf.distribute`
        strategy, in whose scope they are made here too.
        """
        optimizer = getattr(self, "optimizer", None)
        if optimizer is None or optimizer.built or not self.built:
            return
        strategy = getattr(self, "distribute_strategy", None)  # TensorFlow's trainer
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            optimizer.build(self.trainable_variables)


def _as_tf_dataset_under_tensorflow(x):
    """`TokenBatches` as `tf.data` under TensorFlow, whose Keras adapter
    would fix the shape of its first batches; anything else as it is."""
    if isinstance(x, TokenBatches) and keras.backend.backend() == "tensorflow":
        return x.as_tf_dataset()
    return x


def _with_gradient_norm(optimizer, outputs):
    """A train step's outputs with the optimizer's `gradient_norm` among the
    logs, where it records one (`optimizers.Adam(record_gradient_norm=True)`):
    under JAX, its value in the step's new state, which Keras writes back
    to the variables only later."""
    adam = getattr(optimizer, "inner_optimizer", optimizer)  # under loss scaling
    if not getattr(adam, "record_gradient_norm", False):
        return outputs
    if keras.backend.backend() == "jax":
        logs, (trainable, non_trainable, optimizer_values, metrics) = outputs
        index = next(i for i, v in enumerate(optimizer.variables) if v is adam.gradient_norm)
        return dict(logs, gradient_norm=optimizer_values[index]), (trainable, non_trainable, optimizer_values, metrics)
    return dict(outputs, gradient_norm=adam.gradient_norm.value)
