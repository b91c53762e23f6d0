"""The one path of every conversion: a family's module reads a checkpoint
into a `Conversion` (our model's options, its weights by variable path,
the tokenizer and the search), and `build` makes, checks and saves the
translator. The weights of a block come from torch's `Linear` and
`LayerNorm` tensors under BART's names, which Marian, FSMT and fairseq
share."""

import dataclasses

import numpy as np

from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.layers.initial_values import initial_values

# The logit of a row our vocabulary has and the published one lacks (our
# BOS where it copies another row; the smaller side's missing rows): e^-50
# of the others' probability, below float32's resolution of their sum.
ABSENT_LOGIT = -50.0

# The names of a block's sublayers in transformers' BART-like models and in
# fairseq, by ours.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
ENCODER_SUBLAYERS = {
    "self_attention": "self_attn", "self_attention_norm": "self_attn_layer_norm",
    "inner_dense": "fc1", "outer_dense": "fc2", "feed_forward_norm": "final_layer_norm",
}
DECODER_SUBLAYERS = ENCODER_SUBLAYERS | {"cross_attention": "encoder_attn", "cross_attention_norm": "encoder_attn_layer_norm"}


@dataclasses.dataclass
class Conversion:
    """A checkpoint, read by its family's module.

    Attributes:
        model: our `ModelConfig` fields (`Transformer` arguments) but the
            vocabulary and the sharing of the embeddings.
        weights: our weights by variable path: NumPy arrays, or functions
            of no arguments that read them (`Tensors.later`), called as
            each weight is made.
        sharing: which of our layouts holds the embeddings: "all" (one
            matrix), "target" (the target embedding is the output
            projection) or "none".
        tokenizer: the converted tokenizer, holding the `IdMap`.
        settings: the `Translator`'s search settings and languages.
        source: the checkpoint, for errors.
    """

    model: dict
    weights: dict
    sharing: str
    tokenizer: object
    settings: dict
    source: str


def build(conversion, output, dtype=None):
    """Our Transformer made from the converted weights, checked, and its
    `Translator`, saved into `output`."""
    from keras_transformer.decoding.translator import Translator
    from keras_transformer.models.transformer import Transformer

    # Each weight is made from its value, read as it is made: one copy.
    with initial_values(conversion.weights) as given:
        model = Transformer(
            vocabulary_size=conversion.tokenizer.vocabulary_size,
            share_embeddings=conversion.sharing == "all",
            share_target_embeddings=conversion.sharing == "target",
            dtype=dtype,
            name="transformer",
            **conversion.model,
        )
    check(model, given, conversion.source)
    translator = Translator(
        model, conversion.tokenizer, max_source_length=min(512, model.max_length), **conversion.settings
    )
    translator.save(output)
    return translator


def check(model, given, source):
    """That every weight of `model` was made from a value of the right
    shape, and that no value is left over."""
    if isinstance(given.error, ConversionError):
        raise given.error
    if given.error is not None:
        raise ConversionError(f"{source}: {given.error}")
    missing = sorted({variable.path for variable in model.weights} - given.paths)
    if missing:
        raise ConversionError(f"Converting {source} gave no value for {missing[0]} ({len(missing)} missing).")
    unused = sorted(given.values)
    if unused:
        raise ConversionError(f"Converting {source} gave {unused[0]}, which the model does not have.")


def logits_bias(ids, published):
    """Our logits bias from the published one (a logit per published
    target id): the rows our vocabulary adds are absent, and so is our
    BOS where it copies another row, so that no output takes it."""
    bias = ids.rows(np.asarray(published, np.float32), fill=ABSENT_LOGIT)
    if ids.start_is_copy:
        bias[2] += ABSENT_LOGIT
    return bias


def attention_weights(ours, tensors, prefix, num_heads):
    """A multi-head attention's four projections, from torch's `Linear`s
    `prefix.{q,k,v,out}_proj` (W `[out, in]`), into `ours/...`, each read
    when it is made."""
    weights = {}
    for our_name, their_name in zip(("query", "key", "value"), PROJECTIONS[:3]):
        name = f"{prefix}.{their_name}"
        # W^T [d_model, width] as [d_model, heads, width / heads].
        weights[f"{ours}/{our_name}/kernel"] = tensors.later(
            f"{name}.weight", then=lambda w: w.T.reshape(w.shape[1], num_heads, -1)
        )
        weights[f"{ours}/{our_name}/bias"] = tensors.later(f"{name}.bias", then=lambda b: b.reshape(num_heads, -1))
    name = f"{prefix}.{PROJECTIONS[3]}"
    # W^T [width, d_model] as [heads, width / heads, d_model].
    weights[f"{ours}/attention_output/kernel"] = tensors.later(
        f"{name}.weight", then=lambda w: w.T.reshape(num_heads, -1, w.shape[0])
    )
    weights[f"{ours}/attention_output/bias"] = tensors.later(f"{name}.bias")
    return weights


def block_weights(ours, tensors, prefix, sublayers, num_heads):
    """A block's weights. `sublayers` maps our sublayer names
    (self_attention, cross_attention, their norms, inner_dense,
    outer_dense, feed_forward_norm) to the checkpoint's."""
    weights = {}
    for attention in ("self_attention", "cross_attention"):
        if attention in sublayers:
            weights |= attention_weights(f"{ours}/{attention}", tensors, f"{prefix}.{sublayers[attention]}", num_heads)
    for dense in ("inner_dense", "outer_dense"):
        name = f"{prefix}.{sublayers[dense]}"
        weights[f"{ours}/feed_forward/{dense}/kernel"] = tensors.later(f"{name}.weight", then=np.transpose)
        weights[f"{ours}/feed_forward/{dense}/bias"] = tensors.later(f"{name}.bias")
    for norm in ("self_attention_norm", "cross_attention_norm", "feed_forward_norm"):
        if norm in sublayers:
            weights |= norm_weights(f"{ours}/{norm}", tensors, f"{prefix}.{sublayers[norm]}")
    return weights


def norm_weights(ours, tensors, prefix):
    """torch's `LayerNorm` at `prefix` as our `ours` norm."""
    return {f"{ours}/gamma": tensors.later(f"{prefix}.weight"), f"{ours}/beta": tensors.later(f"{prefix}.bias")}


def stack_weights(tensors, num_layers, num_heads, prefix="model"):
    """Both stacks' blocks, from `{prefix}.encoder.layers.i` and
    `{prefix}.decoder.layers.i`."""
    weights = {}
    for i in range(num_layers):
        weights |= block_weights(f"encoder_block_{i}", tensors, f"{prefix}.encoder.layers.{i}", ENCODER_SUBLAYERS, num_heads)
        weights |= block_weights(f"decoder_block_{i}", tensors, f"{prefix}.decoder.layers.{i}", DECODER_SUBLAYERS, num_heads)
    return weights
