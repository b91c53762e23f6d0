"""The optimizer of section 5.3: Keras's Adam, with the paper's settings
and learning-rate schedule.

Keras's Adam computes the same update on every backend,

    m <- beta_1 m + (1 - beta_1) g
    v <- beta_2 v + (1 - beta_2) g^2
    w <- w - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + eps)

(under torch with `_foreach` operations over all variables at once), so a
model trains the same under each (tests/test_schedule.py).
"""

import keras

from keras_transformer.schedules import TransformerSchedule


def transformer_adam(d_model, warmup_steps=4000, learning_rate_scale=1.0, **kwargs):
    """Adam with beta1=0.9, beta2=0.98, epsilon=1e-9 and the paper's schedule.

    Args:
        d_model: the model size, which scales the schedule.
        warmup_steps: the schedule's warmup, 4000 in the paper.
        learning_rate_scale: the schedule's constant factor, 1 in the paper.
        **kwargs: further `keras.optimizers.Adam` arguments, such as
            `clipnorm` or `loss_scale_factor`.

    Returns:
        A `keras.optimizers.Adam` whose learning rate is a
        `TransformerSchedule`.
    """
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(d_model, warmup_steps, learning_rate_scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )


@keras.saving.register_keras_serializable(package="keras_transformer", name="Adam")
class SavedAdam(keras.optimizers.Adam):
    """The optimizer of files saved by earlier versions, which named a
    subclass of Keras's Adam ("keras_transformer>Adam"), loaded as Keras's
    Adam: the subclass had the same variables and update."""

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return keras.optimizers.Adam.from_config(config, custom_objects=custom_objects)
