"""Marian's tokenizer (OPUS-MT): two SentencePiece models and a vocabulary.

Marian splits the source with `source.spm` and the target with
`target.spm`, and numbers the pieces with `vocab.json` (one vocabulary for
both sides, or `target_vocab.json` for the target), not with SentencePiece's
own ids. Multilingual models take a target-language token such as
`>>deu<<` at the start of the source. The ids are then mapped onto ours
(`IdMap`).
"""

import hashlib
import json
import os
import shutil

import numpy as np
import sentencepiece

from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.id_map import IdMap
from keras_transformer.files import write_atomically

KIND = "marian"
SPACE_MARK = "\u2581"


def _read_vocabulary(path):
    vocabulary = read_json_object(path)
    wrong = [(piece, i) for piece, i in vocabulary.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0]
    if wrong:
        raise ValueError(f"{path} must map pieces to ids >= 0. Received: {wrong[0][0]!r}: {wrong[0][1]!r}")
    return vocabulary


class MarianTokenizer:
    """Marian's tokenization, with our ids.

    Args:
        directory: holds `source.spm`, `target.spm`, `vocab.json` and, for
            separate vocabularies, `target_vocab.json`.
        id_map: the `IdMap` from Marian's ids to ours.

    Ids 0 to 3 are ours: `padding_id`, `unknown_id`, `bos_id`, `eos_id`.
    """

    padding_id = 0
    unknown_id = 1
    bos_id = 2
    eos_id = 3
    FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json")

    def __init__(self, directory, id_map):
        self.directory = directory
        self.id_map = id_map
        self.vocabulary_size = id_map.vocabulary_size
        self._source = sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, "source.spm"))
        self._target = sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, "target.spm"))
        self.source_vocabulary = _read_vocabulary(os.path.join(directory, "vocab.json"))
        target_path = os.path.join(directory, "target_vocab.json")
        self.separate_vocabularies = os.path.isfile(target_path)
        self.target_vocabulary = (
            _read_vocabulary(target_path) if self.separate_vocabularies else self.source_vocabulary
        )
        self._target_pieces = {i: piece for piece, i in self.target_vocabulary.items()}
        unknown = id_map.special["unknown"]
        self._published_unknown = unknown
        # Marian's own special ids, which detokenizing drops.
        self._published_special = {id_map.special[name] for name in ("padding", "eos", "unknown", "start")}

    @classmethod
    def load(cls, directory):
        config = read_json_object(os.path.join(directory, "tokenizer.json"))
        return cls(directory, IdMap.from_config(config["ids"]))

    def save(self, directory):
        """Copies the SentencePiece models and vocabularies into
        `directory`, with `tokenizer.json` (the kind and the ids)."""
        os.makedirs(directory, exist_ok=True)
        for name in self.FILES:
            path = os.path.join(self.directory, name)
            if os.path.isfile(path) and os.path.abspath(self.directory) != os.path.abspath(directory):
                shutil.copyfile(path, os.path.join(directory, name))
        write_atomically(
            os.path.join(directory, "tokenizer.json"),
            json.dumps({"kind": KIND, "vocabulary_size": self.vocabulary_size, "ids": self.id_map.get_config()}, indent=2),
        )

    def fingerprint(self):
        digest = hashlib.sha256(KIND.encode())
        for name in self.FILES:
            path = os.path.join(self.directory, name)
            if os.path.isfile(path):
                with open(path, "rb") as file:
                    digest.update(file.read())
        return digest.hexdigest()[:16]

    def published_ids(self, text, target=False):
        """Marian's ids of `text`, without EOS: what `MarianTokenizer`
        of transformers gives, before our mapping."""
        processor, vocabulary = (self._target, self.target_vocabulary) if target else (self._source, self.source_vocabulary)
        pieces = []
        if not target and text.startswith(">>") and "<<" in text:
            end = text.index("<<") + 2
            pieces.append(text[:end])
            text = text[end:]
        pieces += processor.encode(text, out_type=str)
        return [vocabulary.get(piece, self._published_unknown) for piece in pieces]

    def tokenize(self, strings, num_threads=None, target=False):
        """Our ids of each source string (each target string with
        `target=True`), without BOS or EOS."""
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
        """Target text from our ids; special ids are dropped."""
        if isinstance(ids, np.ndarray) or hasattr(ids, "shape"):
            ids = np.asarray(ids).tolist()
        ids = list(ids)
        if ids and not isinstance(ids[0], (int, np.integer)):
            return [self._detokenize_row(row) for row in ids]
        return self._detokenize_row(ids)

    def _detokenize_row(self, ids):
        published = [i for i in self.id_map.to_published([int(i) for i in ids]) if i not in self._published_special]
        pieces = [self._target_pieces.get(i, "") for i in published]
        # transformers decodes a shared vocabulary's pieces with the source
        # model; the pieces, not the model, make the text.
        processor = self._target if self.separate_vocabularies else self._source
        return processor.decode_pieces(pieces).replace(SPACE_MARK, " ").strip()

    def id_to_piece(self, ids):
        """The target piece of each of our ids, for display."""
        return [self._target_pieces.get(i, "<unk>") for i in self.id_map.to_published(np.asarray(ids).reshape(-1))]
