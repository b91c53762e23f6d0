"""Keras's training and inference entry points, with the data checked first.

`Transformer` takes its inputs' ids from `fit`, `evaluate`, `predict` and
the batch methods checked against its vocabulary: on the host where the
data allows it (under JAX the compiled steps then leave the id callback
out), in the data pipeline or in the model otherwise.
"""

import contextlib

import keras

from keras_transformer.backend import jax_steps
from keras_transformer.backend import state
from keras_transformer.backend import torch_step
from keras_transformer.checks import check_ids_on_host
from keras_transformer.checks import check_model_data
from keras_transformer.checks import ids_checked_on_host
from keras_transformer.data.batches import TokenBatches


class CheckedData:
    """The entry points of a `keras.Model` that check `x` first."""

    # Which compiled functions were traced for data whose ids were checked
    # on the host (JAX only; see `_checked_data`).
    _steps_without_id_check = frozenset()

    # Under torch, uncompiled: the trainable variables and what else the
    # steps walk, listed when `fit` or `train_on_batch` starts
    # (backend/torch_step.py); else None.
    _step_variables = None

    # Under JAX, while `fit` runs on `TokenBatches`: a batch of padding of
    # each shape its train and test steps will meet, for which the steps
    # are compiled at once (backend/jax_steps.py); else None.
    _batches_ahead = None

    def fit(self, x=None, *args, **kwargs):
        x = self._checked_data(x, "train_function")
        if "validation_data" in kwargs:
            kwargs["validation_data"] = _as_tf_dataset_under_tensorflow(kwargs["validation_data"])
        self._build_optimizer()
        with self._listed_variables(), self._compiled_ahead(x, args, kwargs):
            return super().fit(x, *args, **kwargs)

    def make_train_function(self, force=False):
        ahead = self._batches_ahead
        if ahead is not None and (self.train_function is None or force) and jax_steps.compiles_ahead(self):
            object.__setattr__(self, "_batches_ahead", None)  # once a fit
            jax_steps.compile_ahead(self, *ahead)
            return
        super().make_train_function(force)

    def evaluate(self, x=None, *args, **kwargs):
        return super().evaluate(self._checked_data(x, "test_function"), *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        return super().predict(self._checked_data(x, "predict_function"), *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        x = self._checked_data(x, "train_function")
        self._build_optimizer()
        with self._listed_variables():
            return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        return super().test_on_batch(self._checked_data(x, "test_function"), *args, **kwargs)

    def predict_on_batch(self, x):
        return super().predict_on_batch(self._checked_data(x, "predict_function"))

    # The steps Keras compiles: under JAX they leave the id check out where
    # the data was checked on the host (checks.check_ids_on_host); under
    # torch our layers run their calls directly (layers/calls.py).
    def train_step(self, *args, **kwargs):
        with self._step_context("train_function"):
            if self._step_variables is not None and state.direct():
                return torch_step.train_step(self, *args, self._step_variables, **kwargs)
            return super().train_step(*args, **kwargs)

    def test_step(self, *args, **kwargs):
        with self._step_context("test_function"):
            return super().test_step(*args, **kwargs)

    def predict_step(self, *args, **kwargs):
        with self._step_context("predict_function"):
            return super().predict_step(*args, **kwargs)

    @contextlib.contextmanager
    def _listed_variables(self):
        """Lists the trainable variables for the torch steps run inside."""
        listed = self.built and keras.backend.backend() == "torch" and not getattr(self, "jit_compile", False)
        outer = self._step_variables
        # Set past Keras's attribute tracking, which would count a list of
        # variables as the model's own a second time.
        variables = list(self.trainable_weights) if listed else []
        # None without variables: Keras's step then warns that none train.
        object.__setattr__(self, "_step_variables", torch_step.listed(self, variables) if variables else None)
        try:
            yield
        finally:
            object.__setattr__(self, "_step_variables", outer)

    @contextlib.contextmanager
    def _compiled_ahead(self, x, args, kwargs):
        """Within this block, `make_train_function` compiles the steps for
        the shapes of the batches that `fit(x, *args, **kwargs)` will take,
        where `x` (and the validation data) are `TokenBatches` under JAX."""
        made = self.train_function is not None  # by an earlier fit: new shapes compile as they come
        if made or args or not isinstance(x, TokenBatches) or not jax_steps.compiles_ahead(self):
            yield
            return
        per_epoch = kwargs.get("steps_per_epoch")
        epochs = kwargs.get("epochs", 1) - kwargs.get("initial_epoch", 0)
        train = x.padding_batches(None if per_epoch is None else per_epoch * epochs)
        validation, test = kwargs.get("validation_data"), []
        if (
            isinstance(validation, TokenBatches)
            and kwargs.get("validation_steps") is None
            and kwargs.get("validation_freq", 1) == 1
            and epochs >= 1
        ):
            # How `evaluate` will check its ids decides how the step traces.
            self._checked_data(validation, "test_function")
            test = validation.padding_batches()
        object.__setattr__(self, "_batches_ahead", (train, test))
        try:
            yield
        finally:
            object.__setattr__(self, "_batches_ahead", None)

    @contextlib.contextmanager
    def _step_context(self, function):
        with ids_checked_on_host(function in self._steps_without_id_check):
            with state.direct_steps(compiled=bool(getattr(self, "jit_compile", False))):
                # Direct calls run eagerly: what the layers of a stack derive
                # alike (their attention masks) is derived once a step.
                with state.step_memo() if state.direct() else contextlib.nullcontext():
                    yield

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
