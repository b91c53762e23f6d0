"""What a translator directory holds, and where a preset's is.

A translator directory (`Translator.save`, `train`, `convert`) holds
`model.keras`, the vocabulary and `translator.json`, the search settings.
A preset, as keras-hub's tasks take one, is such a directory, or a
published checkpoint that `keras_transformer.convert` converts into one
once, kept in the cache.
"""

import contextlib
import hashlib
import os
import re
import zipfile

import keras

from keras_transformer.backend import layouts
from keras_transformer.checks import describe_error
from keras_transformer.data.corpus import read_json_object
from keras_transformer.files import cache_directory
from keras_transformer.models.transformer import Transformer

CONFIG_FILE = "translator.json"
MODEL_FILE = "model.keras"
# "hf://owner/name", keras-hub's spelling of a Hugging Face hub id.
HUB_PREFIX = "hf://"


def read_model(directory, for_training=False):
    """The `Transformer` of a translator directory.

    For translating, uncompiled, and under torch its kernels lie as oneDNN
    reads a row's product fastest (`backend/layouts.py`). `for_training`,
    in Keras's order, which its optimizer keeps its moments in, and
    compiled with its optimizer's state where the file holds them (a model
    saved compiled; `train`'s averaged translator is not).
    """
    model_path = os.path.join(directory, MODEL_FILE)
    if not os.path.isfile(model_path):
        raise FileNotFoundError(
            f"No {MODEL_FILE} in {directory!r}. Expected a directory "
            "written by Translator.save (model.keras, subword.model, "
            "subword.json, translator.json)."
        )
    try:
        with contextlib.nullcontext() if for_training else layouts.linear_order():
            model = keras.saving.load_model(model_path, compile=for_training)
    except Exception as error:  # noqa: BLE001 - any unreadable file
        # Keras says "File not found" for a file that is not a zip.
        reason = "not a zip archive" if not zipfile.is_zipfile(model_path) else describe_error(error)
        raise ValueError(
            f"{model_path} cannot be read as a Keras model ({reason}). "
            "Expected the .keras file Translator.save writes; it may be "
            "truncated or overwritten."
        ) from None
    if not isinstance(model, Transformer):
        raise ValueError(
            f"{model_path} holds a {type(model).__name__} ({model.name!r}), not a "
            "keras_transformer Transformer. Expected the model.keras Translator.save "
            "writes; it may have been overwritten by another model."
        )
    return model


def read_settings(directory):
    """The search settings of `translator.json`, or {} without one."""
    path = os.path.join(directory, CONFIG_FILE)
    return read_json_object(path) if os.path.isfile(path) else {}


def preset_directory(preset, source_language=None, target_language=None, cache=None):
    """The translator directory of `preset`: the preset itself where it is
    one; otherwise the conversion of a published checkpoint (a directory in
    transformers' or fairseq's layout, or a hub id, "hf://" optional),
    made by `keras_transformer.convert` the first time and kept under
    `cache` (default `$XDG_CACHE_HOME/keras-transformer/presets`)."""
    preset = os.fspath(preset)
    if os.path.isfile(os.path.join(preset, MODEL_FILE)):
        return preset
    from keras_transformer import convert  # its converters load only for a conversion

    source = preset[len(HUB_PREFIX):] if preset.startswith(HUB_PREFIX) else preset
    if os.path.isdir(source):
        # A local checkpoint: converted anew when its files change.
        key = os.path.abspath(source) + "".join(
            f"\0{name}\0{entry.st_size}\0{entry.st_mtime_ns}"
            for name in sorted(os.listdir(source))
            for entry in [os.stat(os.path.join(source, name))]
        )
    elif convert.HUB_ID.match(source):
        key = source
    else:
        raise ValueError(
            f"Unknown preset {preset!r}. Expected a translator directory (model.keras, the vocabulary, "
            "translator.json), a checkpoint directory in transformers' or fairseq's layout, or a hub id "
            "such as 'hf://Helsinki-NLP/opus-mt-en-de'. An architecture without weights is "
            "keras_transformer.build_transformer(\"base\")."
        )
    key += f"\0{source_language}\0{target_language}"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "--", source.strip("/"))[-80:]
    cache = cache or cache_directory("presets")
    directory = os.path.join(cache, f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")
    if not os.path.isfile(os.path.join(directory, MODEL_FILE)):
        convert.convert(source, directory, source_language=source_language, target_language=target_language)
    return directory
