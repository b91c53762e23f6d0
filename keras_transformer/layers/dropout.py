"""Residual dropout, section 5.4, drawn from a seeded stream."""

import keras

from keras_transformer.backend import random as backend_random
from keras_transformer.layers.calls import DirectCalls


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(DirectCalls, keras.layers.Dropout):
    """Keras's `Dropout`, whose seed stream costs no wait on an accelerator.

    Section 5.4 applies dropout (P_drop = 0.1 in the base model) to each
    sub-layer's output and to the sums of embeddings and positions. Each
    dropout of the model draws from its own seed stream, so that a run is
    reproducible and a checkpoint saves where every stream stands. Under
    torch the stream's counters live in host memory and the mask is drawn on
    the inputs' device (`backend.random`); the masks are those Keras's own
    dropout draws from the same seeds, on every backend.

    Args:
        rate: the fraction of the inputs to drop, in [0, 1].
        noise_shape: the shape of the mask, broadcast to the inputs' shape.
        seed: the stream's seed, or None for an unseeded dropout.
        **kwargs: base layer arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: a tensor of any shape.
        training: whether to drop; otherwise the inputs are returned.
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        with backend_random.host_stream_scope():
            super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        if training and self.rate > 0:
            return backend_random.dropout(inputs, self.rate, self.noise_shape, self.seed_generator)
        return inputs
