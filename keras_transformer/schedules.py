"""The learning-rate schedule of section 5.3."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then decay with the inverse square root of the step.

        lrate = scale * d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)

    The rate grows linearly for the first `warmup_steps` steps, peaks at
    step_num = warmup_steps, then decays as step_num^-0.5. The optimizer
    counts its updates from 0, the paper from 1, so update `iterations` uses
    step_num = iterations + 1.

    Args:
        d_model: the model size (512 for base, 1024 for big).
        warmup_steps: 4000 in the paper.
        scale: a constant factor, 1 in the paper. Smaller batches than the
            paper's 25,000 tokens often train better with a larger one
            (Tensor2Tensor calls it `learning_rate_constant`).
        steps_per_update: batches per optimizer update (gradient
            accumulation): Keras's optimizer then calls the schedule with
            its count of batches, and the rate is that of the update.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, steps_per_update=1):
        for name, value in (("d_model", d_model), ("warmup_steps", warmup_steps), ("scale", scale)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(
                    f"`{name}` must be a positive finite number. Received: {name}={value!r}"
                )
        if isinstance(steps_per_update, bool) or not isinstance(steps_per_update, int) or steps_per_update < 1:
            raise ValueError(f"`steps_per_update` must be an integer >= 1. Received: steps_per_update={steps_per_update!r}")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = float(scale)
        self.steps_per_update = steps_per_update

    def __call__(self, step):
        if self.steps_per_update > 1:
            step = ops.floor_divide(step, self.steps_per_update)
        step_num = ops.cast(step, "float32") + 1.0
        warmup = ops.cast(self.warmup_steps, "float32")
        return self.scale * ops.cast(self.d_model, "float32") ** -0.5 * ops.minimum(
            step_num**-0.5, step_num * warmup**-1.5
        )

    def get_config(self):
        return {
            "d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale,
            "steps_per_update": self.steps_per_update,
        }
