"""Under JAX, a model's train and test steps compiled for all their batch
shapes at once, before the first step.

Keras's JAX trainer compiles a step when a batch of a new shape first
reaches it: one XLA compilation after another, each holding up training.
On an H200 the Multi30k recipe's 4 batch lengths took 40 s of a 118 s run
that way. Where `fit` knows the shapes ahead (`TokenBatches`), the steps
are traced for each shape in turn, and XLA compiles them all at once in
threads (it compiles outside Python's lock). The train and test functions
then run those programs: the same ones Keras would compile, from the same
`jax.jit` of the model's steps, so training computes exactly what it did.
"""

import concurrent.futures
import os

import keras

from keras_transformer.backend import keras_private


def compiles_ahead(model):
    """Whether `model`'s steps can be compiled ahead as Keras would jit
    them: under JAX, compiled, on one device (no `keras.distribution`,
    whose shardings Keras adds), without Flax NNX."""
    return (
        keras.backend.backend() == "jax"
        and bool(getattr(model, "jit_compile", False))
        and not model.run_eagerly
        and keras.distribution.distribution() is None
        and not keras.config.is_nnx_enabled()
    )


def compile_ahead(model, train_batches, test_batches=()):
    """Compiles `model`'s train step for each of `train_batches` and its
    test step for each of `test_batches`, at once, and makes the model's
    train function (and test function, if any) run them. A batch of
    another shape is compiled when it comes, as Keras does."""
    import jax

    def values(variables):
        return [variable.value for variable in variables]

    trainable, non_trainable = values(model.trainable_variables), values(model.non_trainable_variables)
    metrics = values(model.metrics_variables)
    # Keras's jit of each step: its state (argument 0) donated, its outputs
    # where XLA puts them (as on one device).
    train_step = jax.jit(model.train_step, donate_argnums=0)
    test_step = jax.jit(model.test_step, donate_argnums=0)
    train_state = (trainable, non_trainable, values(model.optimizer.variables), metrics)
    # Tracing runs Python, one shape after another; compiling does not.
    programs = [train_step.lower(train_state, batch) for batch in train_batches]
    programs += [test_step.lower((trainable, non_trainable, metrics), batch) for batch in test_batches]
    if programs:
        # At most 8 at a time: compiling a large step takes GBs of host memory.
        threads = min(len(programs), os.cpu_count() or 1, 8)
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda program: program.compile(), programs))
    model.train_function = keras_private.jax_step_function(model, train_step)
    if test_batches:
        model.test_function = keras_private.jax_step_function(model, test_step)
