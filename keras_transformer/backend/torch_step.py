"""Keras's torch train step, with the trainable variables listed once a fit.

Keras's torch trainer lists the model's trainable weights twice a step,
each time walking every layer of the model, and clears the gradients
left from the step before by walking its modules again: at the base
preset's 6 + 6 layers, over 250 variables in about 150 layers, three walks
that the GPU waits on (a torch step waits on the host). Here the variables
and their torch parameters are listed once, when `fit` or `train_on_batch`
starts, as Keras's JAX trainer lists its state, and the gradients come from `torch.autograd.grad`, which
leaves nothing behind to clear. Loss, loss scaling, the optimizer's
`apply` (clipping and all) and the metrics are Keras's, as in its step.
"""

import keras

from keras_transformer.backend import keras_private


def listed(variables):
    """`(variables, their torch parameters)`: the list `train_step` takes.
    Keras's torch variables keep their parameter for life (an `assign`
    copies into it), so that it too is read once."""
    return list(variables), [variable.value for variable in variables]


def train_step(model, data, listed_variables):
    """One step of `model` on `data`, updating `listed_variables` (the
    model's trainable weights, as `listed` gives them before the step);
    returns the metrics' logs."""
    import torch

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = model(x, training=True)
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
    first_input = next(tensor for tensor in keras.tree.flatten(x) if tensor is not None)
    keras_private.loss_tracker(model).update_state(loss, sample_weight=first_input.shape[0])
    loss = model.optimizer.scale_loss(loss)
    # An unused variable (say, a frozen input's embedding) gets no gradient,
    # which the optimizer skips, as it skips Keras's None gradients.
    variables, parameters = listed_variables
    gradients = torch.autograd.grad(loss, parameters, allow_unused=True)
    with torch.no_grad():
        model.optimizer.apply(list(gradients), variables)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
