"""The private Keras names the package still needs, each for a public API
that Keras 3 lacks. `pyproject.toml` bounds Keras to the versions tested."""


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
    from keras.src.backend.common.stateless_scope import in_stateless_scope as keras_in_stateless_scope

    return keras_in_stateless_scope()


def torch_parallel_adam_update(optimizer, grads, variables, learning_rate):
    """Keras's torch Adam update of all variables at once (torch's
    `_foreach` operations), which Keras gives `keras.optimizers.Adam` but
    not its subclasses; there is no public entry to it."""
    from keras.src.backend.torch.optimizers import torch_adam

    torch_adam.Adam._parallel_update_step(optimizer, grads, variables, learning_rate)


def loss_tracker(model):
    """The metric of a compiled model's mean loss, which its train step
    updates and `compute_metrics` reports as "loss"; Keras has no public
    name for it."""
    return model._loss_tracker
