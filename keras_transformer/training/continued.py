"""From a translator directory back to training: its model, compiled as the
run that wrote it compiled it, and its optimizer's state."""

import dataclasses
import os

import keras

from keras_transformer.training.checkpoints import newest_readable
from keras_transformer.training.config import CONFIG_FILE
from keras_transformer.training.config import TrainingConfig
from keras_transformer.training.trainer import compile_model

# The settings of `train` that `compile_model` takes.
COMPILE_SETTINGS = ("warmup_steps", "label_smoothing", "learning_rate_scale", "jit_compile")


def run_compile_settings(directory):
    """`compile_model`'s settings of the run that wrote `directory`: from its
    `train_config.json`, the paper's (`train`'s defaults) where it has none
    (a converted translator, or one saved from Python)."""
    defaults = {field.name: field.default for field in dataclasses.fields(TrainingConfig)}
    given = TrainingConfig.read_fields(directory) if os.path.isfile(os.path.join(directory, CONFIG_FILE)) else {}
    return {name: given.get(name, defaults[name]) for name in COMPILE_SETTINGS}


def compile_as_run(model, directory):
    """Compiles `model` (a translator directory's) for `fit` as `train`
    compiled it in `directory`, and gives its optimizer the state of the
    run's newest checkpoint (`directory/checkpoints`) where there is one:
    the step count, on which the learning rate's schedule goes on, and
    Adam's moments. Without a checkpoint the optimizer starts at step 0,
    as `train --init-from` starts it.

    Returns:
        `model`, compiled.
    """
    compile_model(model, **run_compile_settings(directory))
    restored, path = newest_readable(os.path.join(directory, "checkpoints"))
    if restored is None:
        return model
    model.optimizer.build(model.trainable_variables)
    theirs, ours = restored.optimizer.variables, model.optimizer.variables
    if [tuple(v.shape) for v in theirs] != [tuple(v.shape) for v in ours]:
        raise ValueError(
            f"{path}'s optimizer state does not fit the model of {directory}: it holds {len(theirs)} "
            f"variables, the model's optimizer {len(ours)}. Expected the checkpoints of the run that saved it."
        )
    for mine, saved in zip(ours, theirs):
        mine.assign(keras.ops.convert_to_numpy(saved))
    return model
