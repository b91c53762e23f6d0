"""Adam's update of all variables in torch's fused kernel, under torch.

Keras's torch Adam updates the variables with a dozen `_foreach`
operations, each a pass over all of their memory, after building the lists
of their values and moments from Keras's variables, each step: at the base
preset, over 250 variables, about a seventh of the host's time in a step,
which the GPU waits on. torch's fused Adam (`torch.optim.adam.adam` with
`fused=True`) reads and writes each weight and its moments once, in one
kernel per device and dtype; the lists are made once per set of variables.

torch's Adam adds epsilon to the bias-corrected sqrt(v) where Keras's adds
it to sqrt(v) itself (section 2 of the Adam paper, against its "efficient
version"): with the paper's epsilon = 1e-9 the updates differ only where
sqrt(v) is within a few orders of magnitude of it.
"""

import weakref

import keras

# Per optimizer, per tuple of variable ids: the lists the kernel takes.
_lists = weakref.WeakKeyDictionary()


def update(optimizer, grads, variables, learning_rate):
    """Updates `variables` with `grads` as `optimizer` (a `keras.optimizers.Adam`)
    would, at step `optimizer.iterations + 1`. Returns False, having done
    nothing, where the fused kernel does not apply: amsgrad, gradient
    accumulation, or variables that are not one float dtype on one device."""
    from torch.optim.adam import adam

    if keras.backend.backend() != "torch" or optimizer.amsgrad or optimizer.gradient_accumulation_steps:
        return False
    per_optimizer = _lists.setdefault(optimizer, {})
    key = tuple(map(id, variables))
    lists = per_optimizer.get(key)
    if lists is None:
        lists = per_optimizer[key] = _fused_lists(optimizer, variables)
    if lists is False:
        return False
    parameters, momentums, velocities, steps, step_views = lists
    # Each variable's step, as torch's kernel counts it: it adds 1 to
    # Keras's count of steps taken, read on the device (no wait for it).
    steps.fill_(optimizer.iterations.value)
    adam(
        parameters,
        # The kernel walks a gradient's memory in its parameter's order, and
        # autograd gives a kernel used transposed a transposed view.
        [gradient.contiguous() for gradient in grads],
        momentums,
        velocities,
        [],
        step_views,
        fused=True,
        amsgrad=False,
        beta1=optimizer.beta_1,
        beta2=optimizer.beta_2,
        lr=learning_rate,
        weight_decay=0.0,
        eps=optimizer.epsilon,
        maximize=False,
    )
    return True


def _fused_lists(optimizer, variables):
    import torch

    parameters = [variable.value for variable in variables]
    if not parameters or len({(p.dtype, p.device) for p in parameters}) != 1 or not parameters[0].is_floating_point():
        return False
    indices = [optimizer._get_variable_index(variable) for variable in variables]
    momentums = [optimizer._momentums[index].value for index in indices]
    velocities = [optimizer._velocities[index].value for index in indices]
    steps = torch.zeros(len(parameters), dtype=torch.float32, device=parameters[0].device)
    return parameters, momentums, velocities, steps, list(steps.unbind())
