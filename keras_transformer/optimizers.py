"""The optimizer of section 5.3."""

import keras

from keras_transformer.backend import fused_adam
from keras_transformer.backend import keras_private
from keras_transformer.schedules import TransformerSchedule


@keras.saving.register_keras_serializable(package="keras_transformer")
class Adam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, with each variable's update one kernel under
    TensorFlow.

    Keras writes Adam's update as a dozen element-wise operations per
    variable, each a pass over the variable's memory; under TensorFlow they
    run one by one, and at base size they took a twentieth of a training
    step on a CPU. TensorFlow's `ApplyAdam` kernel does the same arithmetic,

        m <- beta_1 m + (1 - beta_1) g
        v <- beta_2 v + (1 - beta_2) g^2
        w <- w - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + eps)

    in one pass. Under torch, all variables are updated together in torch's
    fused Adam kernel (`backend/fused_adam.py`, which says how its epsilon
    differs), or with `amsgrad` by Keras's own torch Adam (torch's `_foreach`
    operations), which Keras gives to `keras.optimizers.Adam` but not to a
    subclass: its per-variable update launches a dozen operations per
    variable and, on a GPU, copies each Python constant to the device. Under JAX, sparse gradients and `amsgrad`
    (TensorFlow) take Keras's update; JAX's compiler fuses it anyway.

    Args:
        Those of `keras.optimizers.Adam`.
    """

    def apply(self, grads, trainable_variables=None):
        # Under torch, without Keras's walks over the variables each step
        # where they change nothing (`backend/fused_adam.py`).
        if not fused_adam.apply(self, grads, trainable_variables):
            super().apply(grads, trainable_variables)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if keras.backend.backend() == "torch":
            import torch

            with torch.no_grad():
                if not fused_adam.update(self, grads, trainable_variables, learning_rate):
                    keras_private.torch_parallel_adam_update(self, grads, trainable_variables, learning_rate)
            return
        super()._backend_update_step(grads, trainable_variables, learning_rate)

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        if isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        m = self._momentums[index]
        v = self._velocities[index]
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(m),
            v=_handle(v),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
            use_locking=False,
        )


def _handle(variable):
    """The TensorFlow resource behind a Keras or TensorFlow variable."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


def transformer_adam(d_model, warmup_steps=4000, learning_rate_scale=1.0, **kwargs):
    """Adam with beta1=0.9, beta2=0.98, epsilon=1e-9 and the paper's schedule.

    Args:
        d_model: the model size, which scales the schedule.
        warmup_steps: the schedule's warmup, 4000 in the paper.
        learning_rate_scale: the schedule's constant factor, 1 in the paper.
        **kwargs: further `keras.optimizers.Adam` arguments, such as
            `clipnorm` or `loss_scale_factor`.

    Returns:
        An `Adam` (a `keras.optimizers.Adam`) whose learning rate is a
        `TransformerSchedule`.
    """
    return Adam(
        learning_rate=TransformerSchedule(d_model, warmup_steps, learning_rate_scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )
