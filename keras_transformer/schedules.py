"""The learning-rate schedule of section 5.3."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then decay with the inverse square root of the step.

        lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)

    The rate grows linearly for the first `warmup_steps` steps, peaks at
    step_num = warmup_steps, then decays as step_num^-0.5. The optimizer
    counts its updates from 0, the paper from 1, so update `iterations` uses
    step_num = iterations + 1.

    Args:
        d_model: the model size (512 for base, 1024 for big).
        warmup_steps: 4000 in the paper.
    """

    def __init__(self, d_model, warmup_steps=4000):
        if d_model <= 0 or warmup_steps <= 0:
            raise ValueError(
                "`d_model` and `warmup_steps` must be positive. Received: "
                f"d_model={d_model}, warmup_steps={warmup_steps}"
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step_num = ops.cast(step, "float32") + 1.0
        warmup = ops.cast(self.warmup_steps, "float32")
        return ops.cast(self.d_model, "float32") ** -0.5 * ops.minimum(
            step_num**-0.5, step_num * warmup**-1.5
        )

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps}
