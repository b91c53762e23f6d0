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
