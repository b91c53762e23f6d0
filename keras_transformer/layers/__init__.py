"""The paper's building blocks as Keras layers, written with `keras.ops`."""

from keras_transformer import torch_products
from keras_transformer.layers.decoder_block import TransformerDecoderBlock
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.encoder_block import TransformerEncoderBlock
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.position_embedding import LearnedPositionEmbedding
from keras_transformer.layers.position_encoding import SinusoidalPositionEncoding
from keras_transformer.layers.token_embedding import TokenEmbedding
from keras_transformer.layers.transformer_block import TransformerBlock

# Under torch on the CPU, the float32 products in these layers' calls run
# through oneDNN (torch_products) on CPUs where that is the faster: twice
# torch's own rate on the AMD machines of benchmarks/README.md.
torch_products.install(MultiHeadAttention, PositionwiseFeedForward, TokenEmbedding)

__all__ = [
    "Dropout",
    "LearnedPositionEmbedding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionEncoding",
    "TokenEmbedding",
    "TransformerBlock",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
]
