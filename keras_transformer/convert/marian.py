"""Marian's translators (OPUS-MT), in transformers' layout: config, weights
and tokenizer.

`MarianMTModel` is the paper's post-LN Transformer with its embeddings
scaled by sqrt(d_model), sinusoids laid out as all sines then all cosines,
swish in the feed-forward networks, a bias on the logits, and one
vocabulary numbered by `vocab.json`: EOS 0, padding last, decoding from
padding. Its search divides a hypothesis's log-probability by
length^alpha.
"""

import os

import numpy as np

from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.convert.checkpoint import read_config
from keras_transformer.convert.checkpoint import read_tensors
from keras_transformer.convert.checkpoint import search_settings
from keras_transformer.convert.checkpoint import sinusoids_in_halves
from keras_transformer.convert.checkpoint import stack_fields
from keras_transformer.convert.pipeline import Conversion
from keras_transformer.convert.pipeline import logits_bias
from keras_transformer.convert.pipeline import stack_weights
from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.id_map import IdMap
from keras_transformer.data.languages import pair_or_none
from keras_transformer.data.marian_tokenizer import MarianTokenizer

MODEL_TYPE = "marian"


def model_config(config, source):
    """Our `ModelConfig` fields for a `MarianConfig` (a dict)."""
    for name, expected in (("normalize_before", False), ("add_final_layer_norm", False), ("scale_embedding", True),
                           ("static_position_embeddings", True), ("normalize_embedding", False)):
        if name in config and config[name] != expected:
            raise ConversionError(f"{source}: {name}={config[name]!r} is not supported; expected {expected}.")
    return stack_fields(config, source, default_activation="gelu")


def id_map(config):
    vocabulary_size = max(config["vocab_size"], config.get("decoder_vocab_size") or config["vocab_size"])
    pad = config.get("pad_token_id", vocabulary_size - 1)
    return IdMap(
        vocabulary_size, padding=pad, unknown=config.get("unk_token_id", 1),
        start=config.get("decoder_start_token_id", pad), eos=config.get("eos_token_id", 0),
    )


def weights(config, tensors, ids, shared):
    """Our weights by variable path, from the checkpoint's tensors."""
    num_heads = config["encoder_attention_heads"]
    if shared:
        # One matrix, saved under any of its names.
        found = {"token_embedding/embeddings": tensors.later(
            "model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
            "lm_head.weight", then=ids.rows,
        )}
    else:
        target = ("model.decoder.embed_tokens.weight", "lm_head.weight")
        found = {
            "source_embedding/embeddings": tensors.later("model.encoder.embed_tokens.weight", then=ids.rows),
            "target_embedding/embeddings": tensors.later(*target, then=ids.rows),
        }
        if "lm_head.weight" in tensors and not np.array_equal(tensors.first("lm_head.weight"), tensors.first(*target)):
            raise ConversionError(f"{tensors.source}: lm_head.weight is not the decoder's embedding; expected them tied.")
    found["logits_bias/bias"] = logits_bias(ids, logits_bias_of(config, tensors))
    d_model = config["d_model"]
    inverse_frequencies = 10000.0 ** (-2.0 * np.arange((d_model + 1) // 2) / d_model)
    table = sinusoids_in_halves(config.get("max_position_embeddings", 1024), d_model, inverse_frequencies)
    found["position_table/position_embeddings"] = table[:, :d_model]
    return found | stack_weights(tensors, config["encoder_layers"], num_heads)


def logits_bias_of(config, tensors):
    """`final_logits_bias`, one logit per target id; zeros where the
    checkpoint lacks it, as transformers loads such a file."""
    size = config.get("decoder_vocab_size") or config["vocab_size"]
    if "final_logits_bias" not in tensors:
        return np.zeros(size, np.float32)
    bias = tensors.first("final_logits_bias").reshape(-1)
    if len(bias) != size:
        raise ConversionError(
            f"{tensors.source}: final_logits_bias has {len(bias)} logits; expected {size}, the target vocabulary's "
            "size in config.json."
        )
    return bias


def languages(directory):
    """The pair MarianTokenizer's settings name (`source_lang`,
    `target_lang`), or None."""
    path = os.path.join(directory, "tokenizer_config.json")
    settings = read_json_object(path) if os.path.isfile(path) else {}
    return pair_or_none(settings.get("source_lang"), settings.get("target_lang"))


def read(directory):
    """The Marian checkpoint in `directory`, as a `Conversion`."""
    config = read_config(directory, MarianTokenizer.FILES, "Marian's tokenizer files")
    source = os.path.abspath(directory)
    ids = id_map(config)
    shared = config.get("share_encoder_decoder_embeddings", True)
    settings = search_settings(directory, config) | {"languages": languages(directory)}
    return Conversion(
        model_config(config, source), weights(config, read_tensors(directory), ids, shared),
        "all" if shared else "target", MarianTokenizer.from_directory(directory, ids), settings, source,
    )
