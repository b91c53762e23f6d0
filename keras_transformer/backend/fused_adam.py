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

import itertools
import operator
import weakref

import keras

# Per optimizer, per tuple of variable ids: what `_listed` found.
_found = weakref.WeakKeyDictionary()


def _listed(find, optimizer, variables):
    """`find(optimizer, variables)`, found once per optimizer and list of
    variables: `apply` and `update` run each step on the same list."""
    per_optimizer = _found.setdefault(optimizer, {})
    key = tuple(map(id, variables))
    found = per_optimizer.get(key)
    # Ids are reused once a variable is freed: the variables must be these.
    if found is None or not all(map(operator.is_, found["variables"], variables)):
        found = per_optimizer[key] = {"variables": tuple(variables)}
    if find not in found:
        found[find] = find(optimizer, found["variables"])
    return found[find]


def _plain(optimizer, variables):
    """Whether Keras's `apply` would update `variables` as they are."""
    optimizer._check_variables_are_known(variables)  # Keras's error for one it was not built on
    return not any(v.overwrite_with_gradient or v.constraint is not None for v in variables)


def apply(optimizer, grads, variables):
    """Keras's `optimizer.apply(grads, variables)` under torch, where it
    comes to the update alone: each variable known to the optimizer, none
    overwritten with its gradient, none constrained, no gradient missing,
    no loss scale. Keras's `apply` walks every variable three times a step
    to find that out (about 2,000 Python calls at the base preset, while a
    GPU waits); here it is found once per list of variables. Then, as in
    Keras's: clipping, weight decay, the update, the moving average and
    the step count. Returns False, having done nothing, elsewhere."""
    if (
        keras.backend.backend() != "torch"
        or variables is None
        or not optimizer.built
        or optimizer.loss_scale_factor is not None
        or not grads
        or any(map(operator.is_, grads, itertools.repeat(None)))
    ):
        return False
    if not _listed(_plain, optimizer, variables):
        return False
    optimizer._backend_apply_gradients(list(grads), list(variables))
    optimizer.iterations.assign_add(1)
    return True


def update(optimizer, grads, variables, learning_rate):
    """Updates `variables` with `grads` as `optimizer` (a `keras.optimizers.Adam`)
    would, at step `optimizer.iterations + 1`. Returns False, having done
    nothing, where the fused kernel does not apply: amsgrad, gradient
    accumulation, or variables that are not one float dtype on one device."""
    import torch

    if keras.backend.backend() != "torch" or optimizer.amsgrad or optimizer.gradient_accumulation_steps:
        return False
    lists = _listed(_fused_lists, optimizer, variables)
    if lists is False:
        return False
    parameters, momentums, velocities, steps, step_views = lists
    # Each variable's step, as torch's kernel counts it: Keras's count of
    # steps taken, plus 1, on the device (no wait for it).
    steps.fill_(optimizer.iterations.value).add_(1)
    if isinstance(learning_rate, torch.Tensor) and learning_rate.device.type != "cpu":
        learning_rate = learning_rate.to(parameters[0].device, non_blocking=True)
    # torch's fused kernel as `torch.optim.adam.adam(..., fused=True)` calls
    # it for one device and dtype, without its walks over the lists.
    torch._fused_adam_(
        parameters,
        # The kernel walks a gradient's memory in its parameter's order, and
        # autograd gives a kernel used transposed a transposed view.
        list(map(torch.Tensor.contiguous, grads)),
        momentums,
        velocities,
        [],
        step_views,
        amsgrad=False,
        lr=learning_rate,
        beta1=optimizer.beta_1,
        beta2=optimizer.beta_2,
        weight_decay=0.0,
        eps=optimizer.epsilon,
        maximize=False,
        grad_scale=None,
        found_inf=None,
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
