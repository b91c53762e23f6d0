"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3.

    import keras_transformer
    model = keras_transformer.build_transformer("base", vocabulary_size=37000)
"""

from keras_transformer import environment

# Before Keras is imported: the backend is checked. Nothing else changes,
# except in the command line and the recipes (environment.py).
environment.prepare()

from keras_transformer import checks  # noqa: E402
from keras_transformer import data  # noqa: E402
from keras_transformer import decoding  # noqa: E402
from keras_transformer import layers  # noqa: E402
from keras_transformer import losses  # noqa: E402
from keras_transformer import metrics  # noqa: E402
from keras_transformer import models  # noqa: E402
from keras_transformer import optimizers  # noqa: E402
from keras_transformer import schedules  # noqa: E402
from keras_transformer import training  # noqa: E402
from keras_transformer.decoding import Translator  # noqa: E402
from keras_transformer.environment import configure_process  # noqa: E402
from keras_transformer.models import Transformer  # noqa: E402
from keras_transformer.models import build_transformer  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Transformer",
    "Translator",
    "build_transformer",
    "configure_process",
    "checks",
    "data",
    "environment",
    "decoding",
    "layers",
    "losses",
    "metrics",
    "models",
    "optimizers",
    "schedules",
    "training",
]
