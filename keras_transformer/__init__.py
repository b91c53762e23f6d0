"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3.

    import keras_transformer
    model = keras_transformer.build_transformer("base", vocabulary_size=37000)
"""

from keras_transformer import checks
from keras_transformer import data
from keras_transformer import decoding
from keras_transformer import layers
from keras_transformer import losses
from keras_transformer import metrics
from keras_transformer import models
from keras_transformer import optimizers
from keras_transformer import schedules
from keras_transformer import training
from keras_transformer.decoding import Translator
from keras_transformer.models import Transformer
from keras_transformer.models import build_transformer

__version__ = "0.1.0"

__all__ = [
    "Transformer",
    "Translator",
    "build_transformer",
    "checks",
    "data",
    "decoding",
    "layers",
    "losses",
    "metrics",
    "models",
    "optimizers",
    "schedules",
    "training",
]
