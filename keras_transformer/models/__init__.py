"""The encoder-decoder model and its presets."""

from keras_transformer.models.config import ModelConfig
from keras_transformer.models.presets import PRESETS
from keras_transformer.models.quantization import quantized
from keras_transformer.models.transformer import PADDING_ID
from keras_transformer.models.transformer import Transformer
from keras_transformer.models.transformer import build_transformer

__all__ = ["PADDING_ID", "PRESETS", "ModelConfig", "Transformer", "build_transformer", "quantized"]
