"""Published translators of the paper's architecture, converted into ours.

    keras-transformer convert Helsinki-NLP/opus-mt-en-de --output opus-mt-en-de

writes a translator directory, as `train` does, that `translate`,
`evaluate`, `tune`, `export`, `train --init-from` and `Translator.load`
use under every backend. One module per family reads its config, weights
and tokenizer into a `pipeline.Conversion`: `marian` (OPUS-MT), `fsmt`
(fairseq's WMT19 models in transformers' layout), `fairseq` (fairseq's
own checkpoints) and `m2m100` (M2M-100 and NLLB-200), the last three
through `fairseq_transformer`;
`pipeline.build` makes, checks and saves every translator alike.
"""

import importlib
import os
import re

from keras_transformer.backend import layouts
from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.convert.checkpoint import output_directory
from keras_transformer.convert.checkpoint import download_files
from keras_transformer.convert.pipeline import build
from keras_transformer.data.corpus import read_json_object

__all__ = ["ConversionError", "convert", "families"]

# A hub id: owner/name, nothing that exists on disk.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


# The families by what identifies them: transformers' `model_type`, or
# "fairseq" for a directory with `model.pt`; each its converter's module.
FAMILIES = {"marian": "marian", "fsmt": "fsmt", "fairseq": "fairseq", "m2m_100": "m2m100"}
TRANSFORMERS_TYPES = ("fsmt", "m2m_100", "marian")
# The families whose checkpoints translate between many languages.
MULTILINGUAL = {"m2m100": "M2M-100 and NLLB-200"}
# Published types that are not this architecture, and why.
OTHER_ARCHITECTURES = {
    "nllb-moe": "NLLB-MoE replaces feed-forward networks with mixtures of experts, which this package does not "
                "have; its dense models (facebook/nllb-200-distilled-600M, -1.3B, -3.3B) convert",
}


def families():
    return sorted(FAMILIES)


def _converter(family):
    return importlib.import_module(f"keras_transformer.convert.{FAMILIES[family]}")


def family_of(directory):
    """The converter module for the checkpoint in `directory`."""
    config_path = os.path.join(directory, "config.json")
    if os.path.isfile(config_path):
        model_type = read_json_object(config_path).get("model_type")
        if model_type in TRANSFORMERS_TYPES:
            return _converter(model_type)
        if model_type in OTHER_ARCHITECTURES:
            raise ConversionError(f"{config_path} describes a model of type {model_type!r}: {OTHER_ARCHITECTURES[model_type]}.")
        raise ConversionError(
            f"{config_path} describes a model of type {model_type!r}. Supported: "
            f"{list(TRANSFORMERS_TYPES)} (transformers' layout), or a fairseq directory with model.pt."
        )
    if os.path.isfile(os.path.join(directory, "model.pt")):
        return _converter("fairseq")
    raise ConversionError(
        f"{directory} holds neither config.json (a Hugging Face model) nor model.pt (a fairseq checkpoint)."
    )


def download(hub_id):
    """A hub model's directory, downloaded with `huggingface_hub`."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConversionError(
            f"{hub_id!r} is not a directory here, and downloading it needs huggingface_hub "
            '(pip install "keras-vaswani[convert]").'
        ) from None
    try:
        from huggingface_hub import list_repo_files

        return snapshot_download(hub_id, allow_patterns=download_files(list_repo_files(hub_id)))
    except Exception as error:  # noqa: BLE001 - network and hub errors alike
        try:
            # Offline (HF_HUB_OFFLINE=1) or unreachable: the hub cache's copy, where it has one.
            return snapshot_download(hub_id, local_files_only=True)
        except Exception:  # noqa: BLE001 - not in the cache either: the first error says why
            pass
        raise ConversionError(f"{hub_id!r} could not be downloaded: {str(error).splitlines()[0]}") from None


def convert(source, output, dtype=None, source_language=None, target_language=None):
    """Converts a published translator into a translator directory.

    Args:
        source: a directory in transformers' layout (`config.json`,
            `model.safetensors` or `pytorch_model.bin`, tokenizer files), a
            fairseq checkpoint directory (`model.pt`, `dict.*.txt`,
            `bpecodes`), or a hub id such as "Helsinki-NLP/opus-mt-en-de".
        output: the new directory; nothing is left there if it fails.
        dtype: the dtype policy of the model, such as "mixed_bfloat16".
        source_language, target_language: a multilingual model's pair, in
            its codes ("eng_Latn" and "deu_Latn" for NLLB-200, "en" and
            "de" for M2M-100); a translator of one pair takes none.

    Returns:
        The `Translator`, as `Translator.load(output)` would give it.
    """
    directory = str(source)
    if not os.path.isdir(directory):
        if os.path.exists(directory) or not HUB_ID.match(directory):
            raise ConversionError(
                f"{directory} is not a directory. Expected a model directory or a hub id such as "
                "Helsinki-NLP/opus-mt-en-de."
            )
        directory = download(directory)
    family = family_of(directory)
    languages = {name: code for name, code in (("source_language", source_language),
                                               ("target_language", target_language)) if code is not None}
    if languages and family.__name__.rpartition(".")[2] not in MULTILINGUAL:
        raise ConversionError(
            f"{directory} translates one pair; languages are chosen for {', '.join(MULTILINGUAL.values())} only."
        )
    # Its kernels lie in memory as Translator.load lays them (backend/layouts.py).
    with output_directory(output) as temporary, layouts.linear_order():
        return build(family.read(directory, **languages), temporary, dtype)
