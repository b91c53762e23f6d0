"""A tiny Transformer learns to reverse sequences with plain `model.fit`."""

import keras
import numpy as np

import keras_transformer as kt

V = 16


class KeepBestAndStopAt(keras.callbacks.Callback):
    """Keeps the weights of the best validation epoch; stops at `target`."""

    def __init__(self, target):
        super().__init__()
        self.target = target
        self.best = -1.0
        self.best_weights = None

    def on_epoch_end(self, epoch, logs=None):
        accuracy = logs["val_masked_token_accuracy"]
        if accuracy > self.best:
            self.best, self.best_weights = accuracy, self.model.get_weights()
        if accuracy >= self.target:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.model.set_weights(self.best_weights)


def test_tiny_model_learns_to_reverse_sequences():
    inputs, labels = kt.data.reversal_task(6000, V, seed=0)
    validation = kt.data.reversal_task(500, V, seed=1)
    held_out_inputs, held_out_labels = kt.data.reversal_task(1000, V, seed=2)
    model = kt.build_transformer("tiny", vocabulary_size=V, dropout=0.0)
    model.compile(
        # A short warmup to a peak rate of 2.5e-3, then decaying: the target in
        # about 3 epochs; warmup 1000's rate rises past 2e-3 for 10 epochs, and
        # the accuracy took 5 and could swing away from it (0.99, then 0.83).
        optimizer=kt.optimizers.transformer_adam(d_model=64, warmup_steps=100, learning_rate_scale=0.2),
        loss=kt.losses.LabelSmoothedCrossEntropy(),
        metrics=[kt.metrics.MaskedTokenAccuracy()],
    )
    untrained = model.evaluate(held_out_inputs, held_out_labels, verbose=0, return_dict=True)
    model.fit(
        inputs,
        labels,
        batch_size=64,
        epochs=15,
        validation_data=validation,
        callbacks=[KeepBestAndStopAt(0.995)],
        verbose=0,
    )
    trained = model.evaluate(held_out_inputs, held_out_labels, verbose=0, return_dict=True)
    assert untrained["masked_token_accuracy"] < 0.2
    assert trained["masked_token_accuracy"] >= 0.99, trained
    # Reversal is learned, not the identity: the first label is the last
    # source token, which differs from the first source token most of the time.
    predictions = np.argmax(model.predict(held_out_inputs, verbose=0), -1)
    first_tokens = held_out_inputs["source_ids"][:, 0]
    lengths = (held_out_inputs["source_ids"] != 0).sum(1)
    last_tokens = held_out_inputs["source_ids"][np.arange(1000), lengths - 1]
    assert (predictions[:, 0] == last_tokens).mean() >= 0.99
    assert (predictions[:, 0] == first_tokens).mean() < 0.2
