"""The tokenizer a translator directory holds: ours, or a converted one's."""

import importlib
import os

from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.tokenizer import SubwordTokenizer

# Written beside a converted tokenizer's files: its kind and its ids.
CONVERTED_FILE = "tokenizer.json"


# The converted tokenizers: the kind `tokenizer.json` names, and the module
# and class that read it.
KINDS = {
    "marian": ("keras_transformer.data.marian_tokenizer", "MarianTokenizer"),
    "moses_bpe": ("keras_transformer.data.moses_bpe", "MosesBpeTokenizer"),
    "multilingual": ("keras_transformer.data.multilingual_tokenizer", "MultilingualTokenizer"),
}


def load_tokenizer(directory):
    """The tokenizer saved in `directory`: a converted one where
    `tokenizer.json` names its kind, else our `SubwordTokenizer`."""
    path = os.path.join(directory, CONVERTED_FILE)
    if not os.path.isfile(path):
        return SubwordTokenizer.load(directory)
    kind = read_json_object(path).get("kind")
    if kind not in KINDS:
        raise ValueError(f"{path} names an unknown tokenizer. Expected a kind in {sorted(KINDS)}. Received: kind={kind!r}")
    module, name = KINDS[kind]
    return getattr(importlib.import_module(module), name).load(directory)
