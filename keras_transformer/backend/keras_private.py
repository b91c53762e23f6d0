"""The private Keras names the package still needs, each for a public API
that Keras 3 lacks. `pyproject.toml` bounds Keras to the versions tested."""

import functools
import operator

from keras_transformer.backend import state


def in_symbolic_scope():
    """Whether Keras is running a model on placeholders to infer its output
    shapes (`compute_output_spec`); `keras.SymbolicScope` has no public
    getter."""
    try:
        from keras.src.backend.common.symbolic_scope import in_symbolic_scope as keras_in_symbolic_scope
    except ImportError:  # a Keras that moved it: the id checks run on placeholders too
        return False
    return keras_in_symbolic_scope()


def in_stateless_scope():
    """Whether variables read a `keras.StatelessScope`'s values;
    `keras.StatelessScope` has no public getter."""
    return _open_scope("stateless_scope") is not None


def jax_step_function(model, step):
    """Keras's JAX train (or test) function around `step`, a `jax.jit` of
    the model's step: `steps_per_execution` calls of it a call, on the
    batches of an iterator. Keras makes it around its own jit of the step
    (`make_train_function`) and has no public way to pass another."""
    return model._make_function(step)


def loss_tracker(model):
    """The metric of a compiled model's mean loss, which its train step
    updates and `compute_metrics` reports as "loss"; Keras has no public
    name for it."""
    return model._loss_tracker


def torch_value(variable):
    """`variable.value` under Keras's torch backend, as a layer's call reads
    it: its parameter, cast to the dtype of an open autocast scope if it is
    a float variable that autocasts. The same tensor Keras's property gives,
    without its dtype rules and conversions (over 20 microseconds a read, a
    few hundred reads a step). Under other backends, inside a stateless
    scope, or before the variable has a value, Keras's property itself."""
    import keras

    value = variable._value
    # `_scopes()` written out: a read is on a step's hot path, a few hundred a step.
    scopes = _keras_global_state().GLOBAL_STATE_TRACKER
    if value is None or keras.backend.backend() != "torch" or getattr(scopes, "stateless_scope", None) is not None:
        return variable.value
    scope = getattr(scopes, "autocast_scope", None)
    if scope is None or scope.dtype is None or not variable._autocast or not value.is_floating_point():
        return value
    dtype = _torch_dtype(scope.dtype)
    if value.dtype == dtype:
        return value
    copy = state.cast_weight(variable)  # a train step's cast, made for all weights at once
    return copy if copy is not None and copy.dtype == dtype else value.to(dtype)


def assign_add(variable, value):
    """`variable.assign_add(value)`. Under torch, for a tensor of the
    variable's dtype and shape outside a stateless scope, one in-place add
    on its parameter (without gradients, as Keras's assignment): Keras's
    goes through its `__add__`, a conversion, shape checks and an
    assignment, about 80 Python calls, five times a step for our metrics."""
    import keras

    current = variable._value
    if (
        keras.backend.backend() != "torch"
        or current is None
        or getattr(value, "dtype", None) != current.dtype
        or value.shape != current.shape
        or getattr(_scopes(), "stateless_scope", None) is not None
    ):
        variable.assign_add(value)
        return
    current.add_(value.detach())


def autocasts(variable):
    """Whether `variable` is cast to a mixed-precision layer's compute dtype
    when read (`Variable.autocast` is the constructor's argument only)."""
    return bool(variable._autocast)


def _open_scope(name):
    """The scope of kind `name` ("stateless_scope", "autocast_scope") that
    Keras records as open on this thread, or None: what Keras's own getters
    read, a few calls each. The record is read from its module each time,
    as `clear_session` replaces it."""
    return getattr(_scopes(), name, None)


def _scopes():
    """Keras's per-thread record of its open scopes."""
    return _keras_global_state().GLOBAL_STATE_TRACKER


@functools.cache
def _keras_global_state():
    """Keras's global-state module: Keras has no public getter for the open
    autocast scope (`AutocastScope` is not exported), and
    `keras.StatelessScope` none for the open stateless scope."""
    return _keras_common().global_state


@functools.cache
def _keras_common():
    """Keras's backend-independent core, for two things Keras 3 has no
    public API for: its per-thread record of open scopes (no public getter
    of the open autocast or stateless scope) and `AutocastScope` (not
    exported; `Layer.__call__` opens it privately)."""
    from keras.src.backend import common

    return common


@functools.cache
def _torch_dtype(name):
    import torch

    return getattr(torch, name)


def outermost_autocast(layer):
    """The dtype scope that `Layer.__call__` opens around `layer`'s call
    where no call is open: casting float variables to the compute dtype of
    a mixed-precision `layer`. Keras does not export `AutocastScope`."""
    import contextlib

    if layer.compute_dtype == layer.variable_dtype:
        return contextlib.nullcontext()
    return _keras_common().AutocastScope(layer.compute_dtype)


def sublayers(model):
    """`model` and every layer inside it, once each; Keras walks them with
    `_flatten_layers` and has no public name for the walk."""
    return list(model._flatten_layers(include_self=True))


def holds_added_losses(layers):
    """Whether any of `layers` holds losses from `add_loss` (outside a
    stateless scope, the list `Layer.losses` collects). Read without a
    Python call per layer: a torch step asks twice, of a few hundred."""
    return any(map(_own_losses, layers))


_own_losses = operator.attrgetter("_losses")


def compiled_loss(model):
    """The loss `compile` gave `model`, called as `(y, y_pred,
    sample_weight)`, or None; `Trainer.compute_loss` calls it privately."""
    return model._compile_loss


def compiled_metrics(model):
    """The metrics `compile` gave `model`, or None; `Trainer.compute_metrics`
    updates them privately."""
    return model._compile_metrics
