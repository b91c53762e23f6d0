"""Training as in the paper: compile, distribute, checkpoint, resume, average.

    distribution = training.Distribution()
    with distribution.scope():
        model = training.compile_model(build_transformer("base", vocabulary_size=v))
    model = training.fit(model, make_dataset(..., repeat=True), "runs/base", 100000)
"""

from keras_transformer.training.checkpoints import SaveCheckpoints
from keras_transformer.training.checkpoints import average_checkpoints
from keras_transformer.training.checkpoints import list_checkpoints
from keras_transformer.training.checkpoints import restore_latest
from keras_transformer.training.distribution import Distribution
from keras_transformer.training.progress import ProgressLog
from keras_transformer.training.progress import read_curve
from keras_transformer.training.progress import read_history
from keras_transformer.training.config import TrainingConfig
from keras_transformer.training.board import Board
from keras_transformer.training.selection import BestCheckpoints
from keras_transformer.training.validation import Validation
from keras_transformer.training.validation import ValidationBLEU
from keras_transformer.training.continued import compile_as_run
from keras_transformer.training.run import train_translator
from keras_transformer.training.trainer import StopAtStep
from keras_transformer.training.trainer import StopOnNonFiniteLoss
from keras_transformer.training.trainer import compile_model
from keras_transformer.training.trainer import fit
from keras_transformer.training.trainer import use_compilation_cache

__all__ = [
    "BestCheckpoints",
    "Board",
    "Distribution",
    "ProgressLog",
    "SaveCheckpoints",
    "StopAtStep",
    "StopOnNonFiniteLoss",
    "TrainingConfig",
    "Validation",
    "ValidationBLEU",
    "average_checkpoints",
    "compile_as_run",
    "compile_model",
    "fit",
    "list_checkpoints",
    "read_curve",
    "read_history",
    "restore_latest",
    "train_translator",
    "use_compilation_cache",
]
