"""fairseq's `transformer`, in the names transformers' FSMT gives it: its
options, ids and weights, which `fsmt` (transformers' port) and `fairseq`
(fairseq's own checkpoints) both read.

The model is the paper's post-LN Transformer with its embeddings scaled by
sqrt(d_model), fairseq's sinusoids (all sines, then all cosines, the
frequencies exp(-i log(10000) / (d/2 - 1)), the first position numbered
padding + 1 = 2), no bias on the logits, and a source and a target
vocabulary of their own: <s> 0, padding 1, EOS 2, <unk> 3, decoding from
EOS.
"""

import math

import numpy as np

from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.convert.checkpoint import stack_fields
from keras_transformer.convert.pipeline import logits_bias
from keras_transformer.convert.pipeline import stack_weights
from keras_transformer.data.id_map import IdMap

# fairseq's dictionaries begin <s>, <pad>, </s>, <unk>: padding is id 1.
FAIRSEQ_PADDING = 1
REQUIRED = (
    "src_vocab_size", "tgt_vocab_size", "d_model", "encoder_layers", "decoder_layers",
    "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
)


def fairseq_sinusoids(length, d_model, padding=FAIRSEQ_PADDING):
    """`[length, d_model]`: fairseq's position table from its first
    position, padding + 1, on: sin(p w_i) for the first half, cos(p w_i)
    for the second, w_i = exp(-i log(10000) / (d_model / 2 - 1)).

    In float32, step by step as torch computes it, so that the angles
    are torch's: in float64 they would differ by up to 3e-5 at position
    128. Only exp is taken in float64 and rounded, where torch's float32
    exp can be a bit off: with d_model 1024 the tables differ by at most
    2e-6 below position 128 (1.5e-5 at 1,000), with 32 by 6e-8."""
    half = d_model // 2
    step = math.log(10000) / (half - 1)
    exponents = np.arange(half, dtype=np.float32) * np.float32(-step)
    frequencies = np.exp(exponents.astype(np.float64)).astype(np.float32)
    positions = np.arange(padding + 1, padding + 1 + length, dtype=np.float32)
    angles = positions[:, None] * frequencies[None, :]  # [length, half], float32
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    return np.pad(table, ((0, 0), (0, d_model - 2 * half)))


def model_config(config, source):
    """Our `ModelConfig` fields for an `FSMTConfig` (a dict)."""
    missing = [name for name in REQUIRED if name not in config]
    if missing:
        raise ConversionError(f"{source}/config.json lacks {missing}; an FSMTConfig has {list(REQUIRED)}.")
    if not config.get("scale_embedding", True):
        raise ConversionError(f"{source}: scale_embedding=False is not supported; expected True (fairseq's default).")
    # FSMT has no bias on the logits; ours holds our BOS copy's and the
    # smaller vocabulary's absent rows down.
    return stack_fields(config, source, default_activation="relu")


def id_map(config, unknown=3):
    return IdMap(
        max(config["src_vocab_size"], config["tgt_vocab_size"]),
        padding=config.get("pad_token_id", FAIRSEQ_PADDING), unknown=unknown,
        start=config.get("decoder_start_token_id", 2), eos=config.get("eos_token_id", 2),
    )


def sharing(tensors, names, tied):
    """Which of our layouts holds the three matrices (`names` by side:
    source, target, output): one shared ("all"), the target embedding with
    the output ("target"), or three ("none"). Untied matrices are read to
    compare."""
    if tied:
        return "all"
    source, target, output = (tensors.first(*names[side]) for side in ("source", "target", "output"))
    if source.shape == target.shape and np.array_equal(source, target) and np.array_equal(target, output):
        return "all"
    return "target" if np.array_equal(target, output) else "none"


def embedding_weights(tensors, names, shapes, ids, shared):
    """The embeddings and the logits bias by variable path, from the
    published `[vocabulary, d_model]` matrices (rows in published order;
    `names` and `shapes` by side), each read when it is made."""
    if shared == "all":
        if len(set(shapes.values())) > 1:
            raise ConversionError(
                f"{tensors.source}: the embeddings are shared, but the source embedding has shape {shapes['source']}, "
                f"the target embedding {shapes['target']} and the output projection {shapes['output']}; expected "
                "one shape."
            )
        found = {"token_embedding/embeddings": tensors.later(*names["target"], then=ids.rows)}
    else:
        found = {
            "source_embedding/embeddings": tensors.later(*names["source"], then=ids.rows),
            "target_embedding/embeddings": tensors.later(*names["target"], then=ids.rows),
        }
        if shared == "none":
            found["output_projection/embeddings"] = tensors.later(*names["output"], then=ids.rows)
    # The target vocabulary's rows have logit bias 0.
    found["logits_bias/bias"] = logits_bias(ids, np.zeros(shapes["output"][0], np.float32))
    return found


def weights(config, tensors, ids):
    """Our weights by variable path, and the sharing of the embeddings."""
    prefix = "model.decoder"
    # Tied matrices are saved under one of their names (M2M-100's: `shared`;
    # any one of them, with the output layer's where that is tied too).
    tied = config.get("tie_word_embeddings", False)
    output_tied = ("lm_head.weight",) if tied else ()
    names = {
        "source": ("model.encoder.embed_tokens.weight", f"{prefix}.embed_tokens.weight", "model.shared.weight",
                   *output_tied),
        "target": (f"{prefix}.embed_tokens.weight", "model.encoder.embed_tokens.weight", "model.shared.weight",
                   *output_tied),
        "output": (f"{prefix}.output_projection.weight", "lm_head.weight", f"{prefix}.embed_tokens.weight",
                   "model.shared.weight", *(("model.encoder.embed_tokens.weight",) if tied else ())),
    }
    shapes = {side: tensors.shape(*names[side]) for side in names}
    for side, rows in (("source", "src_vocab_size"), ("target", "tgt_vocab_size"), ("output", "tgt_vocab_size")):
        if shapes[side] != (config[rows], config["d_model"]):
            raise ConversionError(
                f"{tensors.source}: {names[side][0]} has shape {shapes[side]}; expected ({config[rows]}, "
                f"{config['d_model']}) from {rows} and d_model in config.json."
            )
    shared = sharing(tensors, names, tied)
    found = embedding_weights(tensors, names, shapes, ids, shared)
    found["position_table/position_embeddings"] = fairseq_sinusoids(
        config.get("max_position_embeddings", 1024), config["d_model"], config.get("pad_token_id", FAIRSEQ_PADDING)
    )
    found |= stack_weights(tensors, config["encoder_layers"], config["encoder_attention_heads"])
    return found, shared
