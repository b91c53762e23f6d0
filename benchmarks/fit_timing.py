"""What the training benchmarks share: timing the steps inside `fit`, and
feeding it ready-made batches of any length.

The scripts import it as a sibling module (`python benchmarks/<script>.py`
puts this folder first on `sys.path`).
"""

import time

import keras


class StepTimes(keras.callbacks.Callback):
    """`perf_counter` times inside one `fit`: `begin` (training began),
    `first` (its first step began) and `ends` (each step ended, once the
    step's logs were on the host; in order).

    Under JAX and torch, Keras runs its step hook on a thread of its own
    (`async_safe`), as it runs the `train` command's: the steps do not wait
    for their logs, as a plain `fit`'s or an eager torch loop's do not (a
    hook on the main thread would make each step wait for the device)."""

    async_safe = True

    def on_train_begin(self, logs=None):
        self.begin = time.perf_counter()
        self.ends = []

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self.first = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())  # list.append holds the GIL

    def on_train_end(self, logs=None):
        # Keras has waited for its threads; they may have ended out of order.
        self.ends.sort()


def one_batch_per_shape(batches):
    """The first batch of each (source, labels) shape: a warm-up that
    compiles every shape."""
    shapes = {}
    for inputs, labels in batches:
        shapes.setdefault(
            (tuple(inputs["source_ids"].shape), tuple(labels.shape)), (inputs, labels)
        )
    return list(shapes.values())


def fit_batches(model, batches, callbacks=()):
    """One `fit` epoch over `batches` of `({"source_ids", "target_ids"}, labels)`.

    They go through a `tf.data` dataset that declares every length variable:
    Keras infers a Python generator's shapes from its first batches, and
    would fix the length.
    """
    import tensorflow as tf

    ids = tf.TensorSpec([None, None], tf.int32)
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(batches), output_signature=({"source_ids": ids, "target_ids": ids}, ids)
    )
    model.fit(dataset, steps_per_epoch=len(batches), epochs=1, verbose=0, callbacks=list(callbacks))
