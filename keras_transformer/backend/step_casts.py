"""Mixed precision in a torch train step: the float32 weights cast to the
compute dtype all at once, and their gradients cast back all at once.

Keras casts a float32 variable to the compute dtype each time a layer of a
mixed-precision model reads it, and autograd casts its gradient back
through each cast: two torch operations per weight a step, 384 at the
base preset's 6 + 6 layers, each dispatched by the host while a GPU waits
(issue 45). Here a fit keeps a compute-dtype copy of each trainable float32
weight that autocasts. A step fills every copy with one `_foreach_copy_`,
our layers read the copies (`keras_private.torch_value`), autograd gives
the gradients with respect to the copies, and one more `_foreach_copy_`
casts those into float32 buffers for the optimizer.

The copies and the buffers stay for the whole fit, taking 1.5 times the
memory of the float32 weights they cover (with a 16-bit compute dtype).
The numbers are Keras's: a copy holds the cast, and the gradient of a
cast is the cast gradient. A read that does not come through `torch_value`
(Keras's own layers) still casts the float32 weight, whose gradient is
added. One difference remains: a weight read twice in a step sums its two
gradients in the compute dtype, where Keras sums them in float32.
"""

import contextlib

from keras_transformer.backend import keras_private
from keras_transformer.backend import state


class StepCasts:
    """Compute-dtype copies of the float32 `parameters` of `variables` that
    autocast, for the steps of one fit, and float32 buffers for their
    gradients."""

    def __init__(self, variables, parameters, compute_dtype):
        import torch

        dtype = getattr(torch, compute_dtype)
        self.indices = [
            index
            for index, (variable, parameter) in enumerate(zip(variables, parameters))
            if keras_private.autocasts(variable) and parameter.dtype == torch.float32
        ]
        self.weights = [parameters[index] for index in self.indices]
        self.copies = [torch.empty_like(weight, dtype=dtype).requires_grad_() for weight in self.weights]
        self.buffers = [torch.empty_like(weight) for weight in self.weights]
        self._reads = {id(variables[index]): copy for index, copy in zip(self.indices, self.copies)}

    @contextlib.contextmanager
    def reading(self):
        """Within this block, our layers read the weights' copies, filled
        from the weights as they are now."""
        import torch

        with torch.no_grad():
            torch._foreach_copy_(self.copies, self.weights)
        with state.cast_weights(self._reads):
            yield

    def gradients(self, loss, parameters):
        """The gradients of `loss` with respect to `parameters` (None for an
        unused one), each read's gradient, the copy's or the weight's own,
        summed in float32."""
        import torch

        count = len(parameters)
        gradients = list(torch.autograd.grad(loss, list(parameters) + self.copies, allow_unused=True))
        reached = [(index, buffer, gradient) for index, buffer, gradient in zip(self.indices, self.buffers, gradients[count:]) if gradient is not None]
        if reached:
            torch._foreach_copy_([buffer for _, buffer, _ in reached], [gradient for _, _, gradient in reached])
        for index, buffer, _ in reached:
            if gradients[index] is not None:  # also read as float32
                buffer.add_(gradients[index])
            gradients[index] = buffer
        return gradients[:count]


def step_casts(model, variables, parameters):
    """The `StepCasts` of a mixed-precision `model`'s steps, or None where
    its variables are read in their own dtype."""
    policy = model.dtype_policy
    if policy.compute_dtype == policy.variable_dtype or policy.compute_dtype not in ("bfloat16", "float16"):
        return None
    casts = StepCasts(variables, parameters, policy.compute_dtype)
    return casts if casts.indices else None
