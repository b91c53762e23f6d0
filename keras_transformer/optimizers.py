"""The optimizer of section 5.3."""

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
