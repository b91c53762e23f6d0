"""The paper's building blocks as Keras layers, written with `keras.ops`."""

from keras_transformer.layers.decoder_block import TransformerDecoderBlock
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.encoder_block import TransformerEncoderBlock
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.logits_bias import LogitsBias
from keras_transformer.layers.position_embedding import LearnedPositionEmbedding
from keras_transformer.layers.position_encoding import SinusoidalPositionEncoding
from keras_transformer.layers.position_encoding import SinusoidalTable
from keras_transformer.layers.token_embedding import TokenEmbedding
from keras_transformer.layers.transformer_block import TransformerBlock

__all__ = [
    "Dropout",
    "LearnedPositionEmbedding",
    "LogitsBias",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionEncoding",
    "SinusoidalTable",
    "TokenEmbedding",
    "TransformerBlock",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
]
