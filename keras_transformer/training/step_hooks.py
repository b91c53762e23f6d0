"""Callbacks whose step hook Keras runs on a thread of its own."""

import keras


class StepHook(keras.callbacks.Callback):
    """A callback whose `on_train_batch_end` Keras may run on a thread of
    its own (`async_safe`, under JAX and torch) once the step's logs are on
    the host, so that no step waits for the device to read them back.

    On that thread a hook must not read `self.model`: under JAX, Keras's
    property syncs the model's state there while the next step consumes it.
    So `trained` is the model as read at the epoch's start, and
    `step(batch)` counts steps from the step counter read then (once an
    epoch, between steps; Keras waits for its threads at an epoch's end).
    """

    # No step waits for its logs to be read back (Keras's async dispatch).
    async_safe = True

    def on_epoch_begin(self, epoch, logs=None):
        from keras_transformer.training.trainer import batches_per_update

        self.trained = self.model
        self._epoch_start = int(keras.ops.convert_to_numpy(self.trained.optimizer.iterations))
        self._per_update = batches_per_update(self.trained)

    def step(self, batch):
        """The optimizer steps (updates) done when the hook of `batch` runs
        (the epoch's last batch done: a call covers several with
        `steps_per_execution`, an update several with accumulation)."""
        return self._epoch_start + (batch + 1) // self._per_update

    def ends_update(self, batch):
        """Whether the hook of `batch` comes where an update ends."""
        return (batch + 1) % self._per_update == 0
