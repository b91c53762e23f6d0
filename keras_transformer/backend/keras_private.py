"""The private Keras names the package uses, each where Keras 3 has no public
API, and the public route each takes, after one warning, in a Keras that has
moved or removed it (tests/test_private_names.py removes each in turn):

- `in_symbolic_scope`: whether Keras is calling a model on placeholders to
  learn its output shapes (`compute_output_spec`); `keras.SymbolicScope`
  has no public getter. Without it, placeholders are told by their type: a
  `keras.KerasTensor`, or a tensor of a TensorFlow graph that is being
  built (whose ids the graph then checks when it runs).
- `in_stateless_scope`: whether variables read a `keras.StatelessScope`'s
  values; `keras.StatelessScope` has no public getter. Without it, every
  seeded dropout draws its seed through Keras's `SeedGenerator.next`,
  which gives the same seeds, a few torch operations more a draw.
- `UpdateGradients`, an optimizer mixin over `_clip_gradients`, the method
  to which every backend's optimizer hands the gradients each update
  applies (after `gradient_accumulation_steps` has averaged its batches,
  before clipping); Keras has no public hook there. In a Keras without it,
  the optimizer's `record_update_gradients` is never called, so no
  gradient norm is logged, and `Adam.build` warns once.
- `ReplicaAccumulation`, an optimizer mixin over `_backend_apply_gradients`
  that makes `gradient_accumulation_steps` run under a `tf.distribute`
  strategy of several replicas. Keras's accumulation chooses between the
  update and the accumulation with a cond inside each replica, and
  `tf.distribute` cannot merge the replicas inside a cond there. The mixin
  takes the cond to the cross-replica context, as Keras's
  `LossScaleOptimizer` does with its own, and runs Keras's pieces of the
  update (`_clip_gradients`, `_backend_update_step`, its accumulators'
  `_backend_*_gradient_accumulators`) in each replica under it. In a Keras
  without them, `accumulates_over_replicas()` is False, and
  `training.compile_model` refuses accumulation over replicas with one
  clear error.
"""

import importlib
import warnings

# Per function: the Keras module and the name in it that it reads, and the
# backends under which the package calls it.
PRIVATE_NAMES = {
    "in_symbolic_scope": ("keras.src.backend.common.symbolic_scope", "in_symbolic_scope", ("tensorflow", "jax", "torch")),
    "in_stateless_scope": ("keras.src.backend.common.stateless_scope", "in_stateless_scope", ("torch",)),
}

_found = {}


def _keras_function(name):
    """Keras's function behind `name`, or None, with one warning, where this
    Keras does not have it."""
    if name not in _found:
        module, attribute, _ = PRIVATE_NAMES[name]
        try:
            _found[name] = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            import keras

            warnings.warn(
                f"Keras {keras.__version__} has no {module}.{attribute}, which "
                f"keras_transformer.backend.keras_private.{name} reads; it takes "
                "its public route instead (the module's docstring says which).",
                RuntimeWarning,
                stacklevel=3,
            )
            _found[name] = None
    return _found[name]


def in_symbolic_scope(inputs=()):
    """Whether `inputs` (a list of tensors) are Keras's placeholders for
    inferring shapes."""
    function = _keras_function("in_symbolic_scope")
    if function is not None:
        return function()
    return any(_is_placeholder(x) for x in inputs)


def _is_placeholder(x):
    import keras

    if isinstance(x, keras.KerasTensor):
        return True
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return tf.is_tensor(x) and not tf.executing_eagerly() and not isinstance(x, tf.Variable)


def in_stateless_scope():
    """Whether variables read a `keras.StatelessScope`'s values; True where
    that cannot be known (the caller then takes Keras's own route)."""
    function = _keras_function("in_stateless_scope")
    return True if function is None else function()


def _has_update_gradients_hook():
    import keras

    return callable(getattr(keras.optimizers.Optimizer, "_clip_gradients", None))


class UpdateGradients:
    """Calls `self.record_update_gradients(grads)` with the gradients of each
    update, where Keras's optimizers clip them (the module's docstring)."""

    def _clip_gradients(self, grads):
        self.record_update_gradients(grads)
        return super()._clip_gradients(grads)


def hooks_update_gradients():
    """Whether `UpdateGradients.record_update_gradients` is called by this
    Keras; warns once where it is not."""
    if "update_gradients" not in _found:  # the cache `_keras_function` keeps
        _found["update_gradients"] = _has_update_gradients_hook()
        if not _found["update_gradients"]:
            import keras

            warnings.warn(
                f"Keras {keras.__version__}'s optimizers have no _clip_gradients, which "
                "keras_transformer.backend.keras_private.UpdateGradients overrides: no gradient norm is logged.",
                RuntimeWarning,
                stacklevel=3,
            )
    return _found["update_gradients"]


# The optimizer internals `ReplicaAccumulation` calls: Keras's own update in
# pieces, as its `_backend_apply_gradients` calls them.
_ACCUMULATION_PIECES = (
    "_backend_apply_gradients", "_backend_update_step", "_backend_increment_gradient_accumulators",
    "_backend_reset_gradient_accumulators", "_clip_gradients", "_get_variable_index",
    "_update_model_variables_moving_average",
)


def accumulates_over_replicas(optimizer):
    """Whether this Keras's `optimizer` has the pieces `ReplicaAccumulation`
    runs (its accumulators are made when it is built)."""
    import keras

    return hasattr(optimizer, "_iterations") and all(
        callable(getattr(keras.optimizers.Optimizer, name, None)) for name in _ACCUMULATION_PIECES
    )


def _replica_context():
    """The `tf.distribute` replica context of several replicas this update
    runs in, or None (another backend, or one replica)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


class ReplicaAccumulation:
    """Keras's gradient accumulation under a `tf.distribute` strategy of
    several replicas (the module's docstring). The update is Keras's: the
    batches' gradients summed in each replica's accumulators, then averaged
    over the batches, clipped, summed over the replicas and applied."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = _replica_context() if self.gradient_accumulation_steps else None
        if context is None:
            return super()._backend_apply_gradients(grads, trainable_variables)
        if self.weight_decay or self.ema_overwrite_frequency:
            raise ValueError(
                "Gradient accumulation over several replicas runs without weight decay and without "
                f"overwriting the weights by their averages. Received: weight_decay={self.weight_decay}, "
                f"ema_overwrite_frequency={self.ema_overwrite_frequency}"
            )
        from keras import ops

        accumulators = [self._accumulated_gradients[self._get_variable_index(v)] for v in trainable_variables]

        def update(grads):  # in each replica: Keras's update from the accumulated batches
            steps = self.gradient_accumulation_steps
            grads = self._clip_gradients([(g + a) / steps for g, a in zip(grads, accumulators)])
            self._backend_update_step(grads, trainable_variables, self.learning_rate)
            self._backend_reset_gradient_accumulators()

        def apply_or_accumulate(strategy, grads):
            ops.cond(
                (self._iterations + 1) % self.gradient_accumulation_steps == 0,
                lambda: strategy.extended.call_for_each_replica(update, args=(grads,)),
                lambda: strategy.extended.call_for_each_replica(
                    self._backend_increment_gradient_accumulators, args=(grads, accumulators)
                ),
            )

        context.merge_call(apply_or_accumulate, args=(grads,))
        if self.use_ema:
            self._update_model_variables_moving_average(self._trainable_variables)
