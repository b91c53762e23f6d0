"""What every converter reads and checks: a checkpoint's config and
tensors as NumPy, the options our model shares with BART-like models, the
search, and a translator directory that a failed conversion leaves
empty."""

import collections.abc
import contextlib
import functools
import json
import os
import shutil
import tempfile

import numpy as np

from keras_transformer.data.corpus import read_json_object

# transformers' and fairseq's names of the activations a `ModelConfig` has.
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}


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
    """The checkpoint's own search: its beam, its length penalty, when a
    beam is done (`early_stopping`), its repetition and length options,
    and EOS forced at the length limit (`forced_eos_token_id`)."""
    generation = dict(config)
    path = os.path.join(directory, "generation_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            generation |= json.load(file)
    forced_eos = generation.get("forced_eos_token_id")
    if forced_eos is not None and forced_eos != generation.get("eos_token_id", forced_eos):
        raise ConversionError(
            f"{directory}: forced_eos_token_id={forced_eos!r} is not eos_token_id={generation['eos_token_id']!r}; "
            "only EOS can be forced at the length limit."
        )
    settings = {
        "beam_size": int(generation.get("num_beams") or 4),
        "alpha": float(generation.get("length_penalty", 1.0)),
        "length_penalty": "power",
        # transformers' default is False: a beam is done by a guess at its current length.
        "early_stopping": generation.get("early_stopping", False),
        "force_eos": forced_eos is not None,
    }
    # The options that are ours too, where the checkpoint sets them.
    for name, default in (("min_length", 0), ("no_repeat_ngram_size", 0), ("repetition_penalty", 1.0)):
        if generation.get(name) not in (None, default):
            settings[name] = generation[name]
    return settings


def read_config(directory, tokenizer_files=(), tokenizer="the tokenizer's files"):
    """`config.json` of `directory`, which must also hold `tokenizer_files`."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{directory} has no config.json. Expected a Hugging Face model directory.")
    for name in tokenizer_files:
        if not os.path.isfile(os.path.join(directory, name)):
            raise ConversionError(f"{os.path.abspath(directory)} has no {name}. Expected {tokenizer} beside config.json.")
    return read_json_object(path)


# A checkpoint's weights in each format: one file, or shards an index names.
WEIGHT_FILES = (
    ("model.safetensors", "model.safetensors.index.json"),
    ("pytorch_model.bin", "pytorch_model.bin.index.json"),
)


def weight_file(names):
    """Of a checkpoint's file `names`, the weights to read, or None: one
    format, safetensors where there are both; one file, or the index of its
    shards."""
    for single, index in WEIGHT_FILES:
        for name in (single, index):
            if name in names:
                return name
    return None


def download_files(names):
    """Of a hub repository's file `names`, those a conversion reads: the
    configs and tokenizer files, and one weight format's (safetensors where
    it has both; an index with its shards), not every copy of the weights."""
    found = weight_file(names)
    weights = [] if found is None else [found]
    if found is not None and found.endswith(".index.json"):
        extension = ".safetensors" if found.startswith("model.safetensors") else ".bin"
        weights += [name for name in names if name.endswith(extension) and "/" not in name]
    kept = [name for name in names if "/" not in name and (name.endswith((".json", ".spm", ".txt", ".model"))
                                                           or name in ("bpecodes", "code"))]
    return sorted(set(kept) | set(weights))


def read_tensors(directory):
    """The tensors of `model.safetensors` (read as NumPy, without torch)
    or `pytorch_model.bin` (with torch), or of the shards their index
    names, as float32 arrays by name."""
    found = weight_file(os.listdir(directory))
    if found is None:
        raise ConversionError(
            f"{directory} has no weights. Expected model.safetensors, pytorch_model.bin, or either's shards "
            "and index (model.safetensors.index.json)."
        )
    paths = [os.path.join(directory, name) for name in shards(directory, found)]
    if found.startswith("model.safetensors"):
        return Tensors(SafetensorsFiles(paths), directory)
    tensors = {}
    for path in paths:
        tensors |= read_torch_file(path)
    return Tensors({name: np.asarray(value, np.float32) for name, value in tensors.items()}, directory)


def shards(directory, name):
    """`[name]`, or for an index the shards its `weight_map` names."""
    if not name.endswith(".index.json"):
        return [name]
    path = os.path.join(directory, name)
    weight_map = read_json_object(path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConversionError(f"{path} has no weight_map. Expected the tensors' shards by name.")
    files = sorted(set(map(str, weight_map.values())))
    missing = [file for file in files if not os.path.isfile(os.path.join(directory, file))]
    if missing:
        raise ConversionError(f"{path} names the shard {missing[0]}, which {directory} lacks.")
    return files


def open_safetensors(path):
    from safetensors import safe_open  # the `convert` extra's

    return safe_open(path, framework="np")


class SafetensorsFiles(collections.abc.Mapping):
    """The tensors of safetensors files by name, each read as float32 when
    it is asked for: a conversion holds the tensors it is converting, not
    the whole checkpoint beside the model it fills. Each read maps its file
    anew and unmaps it after, so that the pages read do not stay resident."""

    def __init__(self, paths):
        self.files = {}
        for path in paths:
            try:
                with open_safetensors(path) as handle:
                    names = list(handle.keys())
            except Exception as error:  # noqa: BLE001 - any unreadable file
                raise ConversionError(f"{path} cannot be read as safetensors ({error}).") from None
            self.files |= dict.fromkeys(names, path)

    def __getitem__(self, name):
        path = self.files[name]
        try:
            with open_safetensors(path) as handle:
                return np.asarray(handle.get_tensor(name), np.float32)
        except Exception as error:  # noqa: BLE001 - a truncated or unreadable tensor
            raise ConversionError(f"{path}: the tensor {name!r} cannot be read ({error}).") from None

    def shape(self, name):
        with open_safetensors(self.files[name]) as handle:
            return tuple(handle.get_slice(name).get_shape())

    def __iter__(self):
        return iter(self.files)

    def __len__(self):
        return len(self.files)


def load_torch(path, safe_classes=(), expected="a dictionary of tensors"):
    """A torch checkpoint as saved, with nothing unpickled but tensors,
    containers and `safe_classes` (torch is needed for `.pt` and `.bin`
    files alone)."""
    try:
        import torch
    except ImportError:
        raise ConversionError(f"Reading {path} needs torch. Install it, or convert from model.safetensors.") from None
    try:
        with torch.serialization.safe_globals(list(safe_classes)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file
        raise ConversionError(
            f"{path} cannot be read as a torch checkpoint ({str(error).splitlines()[0]}). Expected {expected}."
        ) from None


def read_torch_file(path):
    """A torch checkpoint's tensors as float32 NumPy arrays, by name."""
    checkpoint = load_torch(path)
    if not isinstance(checkpoint, dict):
        raise ConversionError(f"{path} holds a {type(checkpoint).__name__}; expected a dictionary of tensors.")
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
        return self.tensors[self.name_of(*names)]

    def shape(self, *names):
        """The shape of `first(*names)`, read from the file's header where
        the tensors are read lazily."""
        name = self.name_of(*names)
        if isinstance(self.tensors, SafetensorsFiles):
            return self.tensors.shape(name)
        return tuple(np.shape(self.tensors[name]))

    def name_of(self, *names):
        for name in names:
            if name in self.tensors:
                return name
        raise ConversionError(f"{self.source} lacks the tensor {names[0]!r}" + (
            f" (or {', '.join(map(repr, names[1:]))})" if len(names) > 1 else ""
        ) + ".")

    def later(self, *names, then=None):
        """A function of no arguments that reads the first of `names` and
        gives `then` of it: a weight read when it is made, so that a
        conversion holds one tensor at a time, not the whole checkpoint."""
        return functools.partial(self._read, names, then)

    def _read(self, names, then):
        tensor = self.first(*names)
        return tensor if then is None else then(tensor)


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
