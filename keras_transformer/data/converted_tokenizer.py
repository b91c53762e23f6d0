"""What a converted model's tokenizer shares: our ids around a published
tokenizer's (`IdMap`), and the `SubwordTokenizer` surface that the
translator, the data pipeline and the export call."""

import hashlib
import json
import os

import numpy as np

from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.id_map import IdMap
from keras_transformer.files import write_atomically


def read_vocabulary(content, name):
    """A published vocabulary file's pieces and ids, checked (`vocab.json`)."""
    try:
        vocabulary = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{name} cannot be read as JSON ({error}).") from None
    if not isinstance(vocabulary, dict):
        raise ValueError(f"{name} must be a JSON object of pieces to ids. Received: {type(vocabulary).__name__}")
    wrong = [(piece, i) for piece, i in vocabulary.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0]
    if wrong:
        raise ValueError(f"{name} must map pieces to ids >= 0. Received: {wrong[0][0]!r}: {wrong[0][1]!r}")
    return vocabulary


class ConvertedTokenizer:
    """Our ids over a published tokenizer's, and its files.

    A subclass names its `KIND`, the `FILES` it needs, the
    `OPTIONAL_FILES` it reads where present and the `SETTINGS` its
    constructor takes after `files` and `id_map`, and gives
    `published_ids(text, target)`, the published tokenizer's ids of a text
    (without EOS), and `published_text(ids)`, the target text of published
    ids with the special ones dropped; its `_target_pieces` map target ids
    to pieces. Ids 0 to 3 are ours: `padding_id`, `unknown_id`, `bos_id`,
    `eos_id`.

    Args:
        files: the contents (bytes) of its files, by name.
        id_map: the `IdMap` from the published ids to ours.
    """

    KIND = None
    FILES = ()
    OPTIONAL_FILES = ()
    SETTINGS = ()
    padding_id = 0
    unknown_id = 1
    bos_id = 2
    eos_id = 3

    def __init__(self, files, id_map):
        missing = [name for name in self.FILES if name not in files]
        if missing:
            raise ValueError(f"A {self.KIND} tokenizer needs {list(self.FILES)}. Received no {missing[0]}.")
        self.files = {name: files[name] for name in self.FILES + self.OPTIONAL_FILES if name in files}
        self.id_map = id_map
        self.vocabulary_size = id_map.vocabulary_size
        # The published special ids, which detokenizing drops.
        self.published_special = set(id_map.special.values())
        self._published_unknown = id_map.special["unknown"]

    @property
    def start_as_id(self):
        """Our id that decoding's first token counts as in an output
        (`IdMap.start_reads_as`)."""
        return self.id_map.start_reads_as

    @classmethod
    def from_directory(cls, directory, id_map, **settings):
        """Reads its files from `directory`: each of `FILES` must be there."""
        files = {}
        for name in cls.FILES + cls.OPTIONAL_FILES:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                with open(path, "rb") as file:
                    files[name] = file.read()
            elif name in cls.FILES:
                raise FileNotFoundError(f"No {name} in {directory}. Expected {list(cls.FILES)}.")
        return cls(files, id_map, **settings)

    @classmethod
    def load(cls, directory):
        """The tokenizer `save` wrote into `directory`."""
        config = read_json_object(os.path.join(directory, "tokenizer.json"))
        settings = {name: config[name] for name in cls.SETTINGS if name in config}
        return cls.from_directory(directory, IdMap.from_config(config["ids"]), **settings)

    def get_config(self):
        settings = {name: getattr(self, name) for name in self.SETTINGS}
        return {"kind": self.KIND, "vocabulary_size": self.vocabulary_size, "ids": self.id_map.get_config(), **settings}

    def save(self, directory):
        """Writes its files into `directory`, with `tokenizer.json` (the
        kind, the ids and the settings)."""
        os.makedirs(directory, exist_ok=True)
        for name, content in self.files.items():
            write_atomically(os.path.join(directory, name), content)
        write_atomically(os.path.join(directory, "tokenizer.json"), json.dumps(self.get_config(), indent=2))

    def fingerprint(self):
        """A digest of everything that decides the ids: the settings, the
        id map and each file (an absent optional one marked as such)."""
        digest = hashlib.sha256(json.dumps(self.get_config(), sort_keys=True).encode())
        for name in self.FILES + self.OPTIONAL_FILES:
            content = self.files.get(name)
            digest.update(b"absent" if content is None else hashlib.sha256(content).digest())
        return digest.hexdigest()[:16]

    def id_to_piece(self, ids):
        """The target piece of each of our ids, for display."""
        return [self._target_pieces.get(i, "<unk>") for i in self.id_map.to_published(np.asarray(ids).reshape(-1))]

    def tokenize(self, strings, num_threads=None, target=False):
        """Our ids of a source string (a target string with `target=True`),
        or of each of a sequence of them, without BOS or EOS."""
        if isinstance(strings, str):
            return self.id_map.to_ours(self.published_ids(strings, target))
        strings = list(strings)
        for index, text in enumerate(strings):
            if not isinstance(text, str):
                raise TypeError(f"`strings[{index}]` must be a str. Received: {type(text).__name__} {text!r:.60}")
        return [self.id_map.to_ours(self.published_ids(text, target)) for text in strings]

    def tokenize_target(self, strings, num_threads=None):
        return self.tokenize(strings, num_threads, target=True)

    def detokenize(self, ids):
        """Target text from our ids (1-D: a string; 2-D: a list of them);
        special ids are dropped."""
        if isinstance(ids, np.ndarray) or hasattr(ids, "shape"):
            ids = np.asarray(ids).tolist()
        ids = list(ids)
        if ids and not isinstance(ids[0], (int, np.integer)):
            return [self.detokenize(row) for row in ids]
        published = self.id_map.to_published([int(i) for i in ids])
        return self.published_text([i for i in published if i not in self.published_special])
