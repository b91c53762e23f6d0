"""What every converter shares: reading a checkpoint's tensors as NumPy,
placing torch's `Linear` and `LayerNorm` weights in our layers, and
writing the translator so that a failed conversion leaves nothing."""

import contextlib
import json
import os
import shutil
import tempfile

import numpy as np

from keras_transformer.data.corpus import read_json_object

# The logit of a row our vocabulary has and the published one lacks (our
# BOS where it copies another row; the smaller side's missing rows): e^-50
# of the others' probability, below float32's resolution of their sum.
ABSENT_LOGIT = -50.0


# transformers' names of the activations a `ModelConfig` has.
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# The names of a post-LN block's sublayers in transformers' BART-like models
# (Marian, FSMT), by ours.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
ENCODER_SUBLAYERS = {
    "self_attention": "self_attn", "self_attention_norm": "self_attn_layer_norm",
    "inner_dense": "fc1", "outer_dense": "fc2", "feed_forward_norm": "final_layer_norm", "projections": PROJECTIONS,
}
DECODER_SUBLAYERS = ENCODER_SUBLAYERS | {"cross_attention": "encoder_attn", "cross_attention_norm": "encoder_attn_layer_norm"}


class ConversionError(ValueError):
    """A checkpoint this package cannot convert, with what was found."""


def activation(name, source):
    if name not in ACTIVATIONS:
        raise ConversionError(f"{source} uses the activation {name!r}. Supported: {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[name]


def stack_fields(config, source, default_activation):
    """Our `ModelConfig` fields of a transformers encoder-decoder config
    with BART's names (Marian's, FSMT's): equal stacks, the decoder's
    feed-forward width where it differs, a fixed position table, torch's
    LayerNorm epsilon, and a logits bias (the published one, or ours for
    the rows a converted vocabulary adds)."""
    for encoder, decoder in (("encoder_layers", "decoder_layers"), ("encoder_attention_heads", "decoder_attention_heads")):
        if config[encoder] != config[decoder]:
            raise ConversionError(
                f"{source}: {encoder}={config[encoder]} and {decoder}={config[decoder]}; the stacks must match."
            )
    return {
        "num_layers": config["encoder_layers"],
        "d_model": config["d_model"],
        "d_ff": config["encoder_ffn_dim"],
        "decoder_d_ff": config["decoder_ffn_dim"] if config["decoder_ffn_dim"] != config["encoder_ffn_dim"] else None,
        "num_heads": config["encoder_attention_heads"],
        "position_encoding": "table",
        "max_length": config.get("max_position_embeddings", 1024),
        "dropout": config.get("dropout", 0.1),
        "attention_dropout": config.get("attention_dropout", 0.0),
        "layer_norm_epsilon": 1e-5,  # torch's LayerNorm default
        "activation": activation(config.get("activation_function", default_activation), source),
        "output_bias": True,
    }


def search_settings(directory, config):
    """The checkpoint's own search: its beam and length penalty."""
    generation = dict(config)
    path = os.path.join(directory, "generation_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            generation |= json.load(file)
    return {
        "beam_size": int(generation.get("num_beams") or 4),
        "alpha": float(generation.get("length_penalty", 1.0)),
        "length_penalty": "power",
    }


def read_config(directory):
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{directory} has no config.json. Expected a Hugging Face model directory.")
    return read_json_object(path)


def read_tensors(directory):
    """The tensors of `model.safetensors` (read as NumPy, without torch)
    or `pytorch_model.bin` (with torch), as float32 arrays by name."""
    safetensors_path = os.path.join(directory, "model.safetensors")
    torch_path = os.path.join(directory, "pytorch_model.bin")
    if os.path.isfile(safetensors_path):
        from safetensors.numpy import load_file

        try:
            tensors = load_file(safetensors_path)
        except Exception as error:  # noqa: BLE001 - any unreadable file
            raise ConversionError(f"{safetensors_path} cannot be read as safetensors ({error}).") from None
    elif os.path.isfile(torch_path):
        tensors = read_torch_file(torch_path)
    else:
        raise ConversionError(
            f"{directory} has no weights. Expected model.safetensors or pytorch_model.bin."
        )
    return Tensors({name: np.asarray(value, np.float32) for name, value in tensors.items()}, directory)


def read_torch_file(path, key=None):
    """A torch checkpoint's tensors as NumPy (torch is needed for `.pt` and
    `.bin` files alone), from `checkpoint[key]` when given."""
    try:
        import torch
    except ImportError:
        raise ConversionError(f"Reading {path} needs torch. Install it, or convert from model.safetensors.") from None
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file
        raise ConversionError(f"{path} cannot be read as a torch checkpoint ({str(error).splitlines()[0]}).") from None
    if key is not None:
        checkpoint = checkpoint.get(key) if isinstance(checkpoint, dict) else None
        if not isinstance(checkpoint, dict):
            raise ConversionError(f"{path} has no {key!r} dictionary of tensors.")
    return {name: value.float().numpy() for name, value in checkpoint.items() if hasattr(value, "numpy")}


class Tensors:
    """A checkpoint's tensors, taken by name with clear errors."""

    def __init__(self, tensors, source):
        self.tensors = tensors
        self.source = source

    def __contains__(self, name):
        return name in self.tensors

    def first(self, *names):
        """The first of `names` the checkpoint has (tied weights are saved
        under one of their names)."""
        for name in names:
            if name in self.tensors:
                return self.tensors[name]
        raise ConversionError(f"{self.source} lacks the tensor {names[0]!r}" + (
            f" (or {', '.join(map(repr, names[1:]))})" if len(names) > 1 else ""
        ) + ".")

    def linear(self, prefix):
        """torch's `Linear` at `prefix`: `(W^T [in, out], b [out])`."""
        return self.first(f"{prefix}.weight").T, self.first(f"{prefix}.bias")


def attention_weights(ours, tensors, prefix, names, num_heads):
    """A multi-head attention's four projections, from torch's `Linear`s
    `prefix.{q,k,v,out}` (named by `names`), into `ours/...`."""
    weights = {}
    for our_name, their_name in zip(("query", "key", "value"), names[:3]):
        kernel, bias = tensors.linear(f"{prefix}.{their_name}")
        d_model, width = kernel.shape
        weights[f"{ours}/{our_name}/kernel"] = kernel.reshape(d_model, num_heads, width // num_heads)
        weights[f"{ours}/{our_name}/bias"] = bias.reshape(num_heads, width // num_heads)
    kernel, bias = tensors.linear(f"{prefix}.{names[3]}")
    width, d_model = kernel.shape
    weights[f"{ours}/attention_output/kernel"] = kernel.reshape(num_heads, width // num_heads, d_model)
    weights[f"{ours}/attention_output/bias"] = bias
    return weights


def block_weights(ours, tensors, prefix, sublayers, num_heads):
    """A post-LN block's weights. `sublayers` maps our sublayer names
    (self_attention, cross_attention, their norms, inner_dense,
    outer_dense, feed_forward_norm) to the checkpoint's."""
    weights = {}
    for attention in ("self_attention", "cross_attention"):
        if attention in sublayers:
            weights |= attention_weights(
                f"{ours}/{attention}", tensors, f"{prefix}.{sublayers[attention]}", sublayers["projections"], num_heads
            )
    for dense in ("inner_dense", "outer_dense"):
        kernel, bias = tensors.linear(f"{prefix}.{sublayers[dense]}")
        weights[f"{ours}/feed_forward/{dense}/kernel"] = kernel
        weights[f"{ours}/feed_forward/{dense}/bias"] = bias
    for norm in ("self_attention_norm", "cross_attention_norm", "feed_forward_norm"):
        if norm in sublayers:
            weights[f"{ours}/{norm}/gamma"] = tensors.first(f"{prefix}.{sublayers[norm]}.weight")
            weights[f"{ours}/{norm}/beta"] = tensors.first(f"{prefix}.{sublayers[norm]}.bias")
    return weights


def assign(model, weights, source):
    """Sets every weight of `model` from `weights` (by variable path),
    checking that each exists with our shape and none is left over."""
    variables = {variable.path: variable for variable in model.weights}
    missing = sorted(set(variables) - set(weights))
    if missing:
        raise ConversionError(f"Converting {source} gave no value for {missing[0]} ({len(missing)} missing).")
    unused = sorted(set(weights) - set(variables))
    if unused:
        raise ConversionError(f"Converting {source} gave {unused[0]}, which the model does not have.")
    for path, variable in variables.items():
        value = np.asarray(weights[path])
        if tuple(value.shape) != tuple(variable.shape):
            raise ConversionError(
                f"{source}: the tensor for {path} has shape {tuple(value.shape)}; expected {tuple(variable.shape)}."
            )
        variable.assign(value.astype(variable.dtype))


def sinusoids_in_halves(length, d_model, inverse_frequencies, first_position=0):
    """`[length, d_model]`: sin(p w_i) in the first half, cos(p w_i) in the
    second, computed in float64 (Marian's and fairseq's layout)."""
    positions = np.arange(first_position, first_position + length, dtype=np.float64)[:, None]
    angles = positions * np.asarray(inverse_frequencies, np.float64)[None, :]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    return np.pad(table, ((0, 0), (0, d_model - table.shape[1])))


@contextlib.contextmanager
def output_directory(output):
    """A temporary directory beside `output`, renamed to it when the block
    ends without an error and removed when it fails."""
    output = os.path.abspath(output)
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise ConversionError(f"{output} already exists and is not empty. Expected a new directory for the translator.")
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    temporary = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.converting-", dir=parent)
    try:
        yield temporary
        if os.path.isdir(output):
            os.rmdir(output)
        os.replace(temporary, output)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
