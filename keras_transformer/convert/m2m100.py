"""M2M-100 and NLLB-200 in transformers' layout (`M2M100ForConditionalGeneration`).

fairseq's `transformer` (`fairseq_transformer`) with pre-LN blocks and a
LayerNorm after each stack, one matrix for both sides' embeddings and the
logits, and a token per language (`MultilingualTokenizer`): decoding
starts from EOS and takes the target language's token first, the
translator's target prefix.
"""

import os

from keras_transformer.convert import fairseq_transformer
from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.convert.checkpoint import read_config
from keras_transformer.convert.checkpoint import read_tensors
from keras_transformer.convert.checkpoint import search_settings
from keras_transformer.convert.pipeline import Conversion
from keras_transformer.convert.pipeline import norm_weights
from keras_transformer.data.languages import pair_or_none
from keras_transformer.data.multilingual_tokenizer import MultilingualTokenizer

MODEL_TYPE = "m2m_100"


def read(directory, source_language=None, target_language=None):
    """The checkpoint in `directory`, translating between the two codes
    (its tokenizer_config.json's `src_lang` and `tgt_lang` by default)."""
    source = os.path.abspath(directory)
    config = read_config(directory)
    if "vocab_size" not in config:
        raise ConversionError(f"{source}/config.json has no vocab_size; an M2M100Config has one.")
    # One vocabulary, and one matrix, for both sides.
    config |= {"src_vocab_size": config["vocab_size"], "tgt_vocab_size": config["vocab_size"], "tie_word_embeddings": True}
    model = fairseq_transformer.model_config(config, source) | {"normalize_first": True}
    ids = fairseq_transformer.id_map(config)
    tensors = read_tensors(directory)
    weights, sharing = fairseq_transformer.weights(config, tensors, ids)
    for ours, theirs in (("encoder_norm", "model.encoder.layer_norm"), ("decoder_norm", "model.decoder.layer_norm")):
        weights |= norm_weights(ours, tensors, theirs)
    try:
        tokenizer = MultilingualTokenizer.from_published(directory, ids, source_language, target_language)
    except (OSError, ValueError) as error:
        raise ConversionError(f"{source}: {error}") from None
    settings = search_settings(directory, config) | {
        "languages": pair_or_none(tokenizer.source_language, tokenizer.target_language),
        "target_prefix": tokenizer.tokenize_target(""),  # the target language's token
    }
    return Conversion(model, weights, sharing, tokenizer, settings, source)
