"""Keras's torch train step, with what it walks listed once a fit.

Keras's torch trainer lists the model's trainable weights twice a step,
each time walking every layer of the model, and clears the gradients
left from the step before by walking its modules again; its loss walks
every layer and weight again for added losses and regularizers, and its
metrics' results walk every layer for metrics. At the base preset's 6 + 6
layers that is over 250 variables in about 150 layers, walked half a dozen
times a step, while the GPU waits (a torch step waits on the host). Here
the variables and their torch parameters are listed once, when `fit` or
`train_on_batch` starts, as Keras's JAX trainer lists its state, and the
gradients come from `torch.autograd.grad`, which leaves nothing behind to
clear. Where no regularizer or `add_loss` adds to the loss, the step's loss
is the compiled loss, which is what Keras's `compute_loss` returns then,
and the metrics' results come from the list `model.metrics` gave after the
first step. Loss scaling, the optimizer's `apply` (clipping and all) and
the metrics' updates are Keras's, as in its step; a model that overrides
`compute_loss`, `compute_metrics` or `get_metrics_result` gets its own.

The model itself is called without `Layer.__call__`, whose outermost call
walks every layer to clear added losses, where none holds any; and a
mixed-precision model reads its weights cast all at once
(`backend/step_casts.py`).
"""

import contextlib

import keras

from keras_transformer.backend import cross_entropy
from keras_transformer.backend import keras_private
from keras_transformer.backend import step_casts


class Listed:
    """What a fit's steps read of `model`, listed when it starts:
    `variables`, the trainable weights, and `parameters`, their torch
    tensors (Keras's torch variables keep their parameter for life; an
    `assign` copies into it)."""

    def __init__(self, model, variables):
        self.variables = list(variables)
        self.parameters = [variable.value for variable in self.variables]
        self.casts = step_casts.step_casts(model, self.variables, self.parameters)
        self.layers = keras_private.sublayers(model)
        self.regularized = any(variable.regularizer is not None for variable in self.variables)
        self.metrics = None  # after the first step, which builds the compiled metrics


def listed(model, variables):
    """The `Listed` `train_step` takes, for `model`'s trainable `variables`."""
    return Listed(model, variables)


def train_step(model, data, lists):
    """One step of `model` on `data`, updating the variables in `lists`,
    the `Listed` its fit made; returns the metrics' logs."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with lists.casts.reading() if lists.casts is not None else contextlib.nullcontext():
        if keras_private.holds_added_losses(lists.layers):
            y_pred = model(x, training=True)  # whose outermost call clears them
        else:
            # `Layer.__call__`, as the outermost call, would walk every layer
            # to clear losses that none holds; of the rest our layers need
            # only its dtype scope (layers/calls.py).
            with keras_private.outermost_autocast(model):
                y_pred = model.call(x, training=True)
    with cross_entropy.shared_step(y_pred):
        return _step(model, lists, x, y, y_pred, sample_weight)


def _step(model, lists, x, y, y_pred, sample_weight):
    import torch

    loss = _loss(model, lists, x, y, y_pred, sample_weight)
    first_input = next(tensor for tensor in keras.tree.flatten(x) if tensor is not None)
    keras_private.loss_tracker(model).update_state(loss, sample_weight=first_input.shape[0])
    loss = model.optimizer.scale_loss(loss)
    # An unused variable (say, a frozen input's embedding) gets no gradient,
    # which the optimizer skips, as it skips Keras's None gradients.
    if lists.casts is not None:
        gradients = lists.casts.gradients(loss, lists.parameters)
    else:
        gradients = torch.autograd.grad(loss, lists.parameters, allow_unused=True)
    with torch.no_grad():
        model.optimizer.apply(list(gradients), lists.variables)
    return _metrics(model, lists, x, y, y_pred, sample_weight)


def _loss(model, lists, x, y, y_pred, sample_weight):
    """`model.compute_loss`: the compiled loss where nothing adds to it."""
    compiled = keras_private.compiled_loss(model)
    if (
        type(model).compute_loss is keras.Model.compute_loss
        and compiled is not None
        and not lists.regularized
        and not keras_private.holds_added_losses(lists.layers)
    ):
        loss = compiled(y, y_pred, sample_weight)
        if loss is not None:
            return loss
    return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)


def _metrics(model, lists, x, y, y_pred, sample_weight):
    """`model.compute_metrics`: the compiled metrics updated, then every
    metric's result, by name (a container's results merged in)."""
    if (
        type(model).compute_metrics is not keras.Model.compute_metrics
        or type(model).get_metrics_result is not keras.Model.get_metrics_result
    ):
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    compiled = keras_private.compiled_metrics(model)
    if compiled is not None:
        compiled.update_state(y, y_pred, sample_weight)
    if lists.metrics is None:
        lists.metrics = model.metrics
    logs = {}
    for metric in lists.metrics:
        result = metric.result()
        if isinstance(result, dict):
            logs.update(result)
        else:
            logs[metric.name] = result
    return logs
