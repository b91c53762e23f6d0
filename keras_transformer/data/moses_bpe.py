"""fairseq's tokenizer for its WMT19 translators: Moses, then BPE.

A line is normalized as Moses' scripts do (Unicode punctuation replaced,
punctuation normalized, non-printing characters removed), split into
Moses tokens (sacremoses, with aggressive dash splits and XML escapes),
and each token into BPE pieces by the merges, in the order learned. A
piece inside a word is spelt "th", one that ends a word "e</w>"
(transformers' FSMT spelling of fairseq's "th@@" and "e"). Each side has
its own vocabulary (`vocab-src.json`, `vocab-tgt.json`) and language;
the ids are then mapped onto ours (`IdMap`). Detokenizing joins the
pieces into words and undoes Moses' tokenization. The special tokens
"<s>", "<pad>", "</s>" and "<unk>" in a source text stay whole, as
transformers' `FSMTTokenizer` keeps them.

The merges are applied by the loop below rather than by subword-nmt's
`apply_bpe`: both give the same pieces (every occurrence of the
best-ranked pair merged, left to right, until no pair has a rank), but
ours reads the FSMT spelling directly and runs in 5 ms on the unique
words of 2,000 sentences against subword-nmt's 6 ms, a second spelling
conversion included; Moses tokenization costs 0.6 s of the same
sentences' 0.7 s either way.
"""

import hashlib
import json
import os
import re
import shutil
import unicodedata

import numpy as np

from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.id_map import IdMap
from keras_transformer.files import write_atomically

KIND = "moses_bpe"
END_OF_WORD = "</w>"
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")
SPECIAL_PATTERN = re.compile("(" + "|".join(map(re.escape, SPECIAL_TOKENS)) + ")")
# Moses' replace-unicode-punctuation.perl, character by character; "。"
# and "．" also take the spaces after them (below).
UNICODE_PUNCTUATION = str.maketrans({
    "，": ",", "、": ",", "”": '"', "“": '"', "∶": ":", "：": ":", "？": "?", "《": '"', "》": '"', "）": ")",
    "！": "!", "（": "(", "；": ";", "」": '"', "「": '"', "～": "~", "’": "'", "…": "...", "━": "-", "〈": "<",
    "〉": ">", "【": "[", "】": "]", "％": "%", **{chr(0xFF10 + digit): str(digit) for digit in range(10)},
})
FULL_STOPS = re.compile(r"[。．]\s*")
# Words whose pieces are remembered; a corpus of many more starts afresh.
CACHE_SIZE = 200_000


def _read_vocabulary(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {os.path.basename(path)} in {os.path.dirname(path)}. Expected a JSON vocabulary.")
    vocabulary = read_json_object(path)
    wrong = [(piece, i) for piece, i in vocabulary.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0]
    if wrong:
        raise ValueError(f"{path} must map pieces to ids >= 0. Received: {wrong[0][0]!r}: {wrong[0][1]!r}")
    return vocabulary


def read_merges(path):
    """The rank of each merge in `merges.txt` ("first second" a line).

    As `FSMTTokenizer` reads it: the text after the last newline is not
    a merge, and a pair listed twice takes its later rank."""
    with open(path, encoding="utf-8") as file:
        lines = file.read().split("\n")[:-1]
    return {tuple(line.split()[:2]): rank for rank, line in enumerate(lines)}


def normalize(text, punctuation_normalizer):
    """Moses' normalization before tokenizing: Unicode punctuation to
    ASCII, `normalize-punctuation.perl`, non-printing characters out."""
    text = FULL_STOPS.sub(". ", text.translate(UNICODE_PUNCTUATION))
    text = punctuation_normalizer.normalize(text)
    return "".join(char for char in text if not unicodedata.category(char).startswith("C"))


class MosesBpeTokenizer:
    """fairseq's Moses and BPE tokenization, with our ids.

    Args:
        directory: holds `vocab-src.json`, `vocab-tgt.json` and
            `merges.txt`.
        id_map: the `IdMap` from the published ids to ours.
        source_language, target_language: Moses' language codes of the
            source and target texts, such as "en" and "de".
        lowercase: lowercase the source before tokenizing (models trained
            on lowercased text).

    Ids 0 to 3 are ours: `padding_id`, `unknown_id`, `bos_id`, `eos_id`.
    """

    padding_id = 0
    unknown_id = 1
    bos_id = 2
    eos_id = 3
    FILES = ("vocab-src.json", "vocab-tgt.json", "merges.txt")

    def __init__(self, directory, id_map, source_language, target_language, lowercase=False):
        from sacremoses import MosesDetokenizer
        from sacremoses import MosesPunctNormalizer
        from sacremoses import MosesTokenizer

        self.directory = directory
        self.id_map = id_map
        self.source_language = source_language
        self.target_language = target_language
        self.lowercase = bool(lowercase)
        self.vocabulary_size = id_map.vocabulary_size
        self.source_vocabulary = _read_vocabulary(os.path.join(directory, "vocab-src.json"))
        self.target_vocabulary = _read_vocabulary(os.path.join(directory, "vocab-tgt.json"))
        self._target_pieces = {i: piece for piece, i in self.target_vocabulary.items()}
        self._ranks = read_merges(os.path.join(directory, "merges.txt"))
        self._moses = {
            language: (MosesPunctNormalizer(lang=language), MosesTokenizer(lang=language))
            for language in (source_language, target_language)
        }
        self._detokenizer = MosesDetokenizer(lang=target_language)
        self._pieces = {}
        self._published_unknown = id_map.special["unknown"]
        # The ids detokenizing drops: the published special tokens.
        self._published_special = {id_map.special[name] for name in ("padding", "unknown", "start", "eos")} | {
            self.target_vocabulary[token] for token in SPECIAL_TOKENS if token in self.target_vocabulary
        }

    @classmethod
    def load(cls, directory):
        config = read_json_object(os.path.join(directory, "tokenizer.json"))
        return cls(
            directory, IdMap.from_config(config["ids"]), config["source_language"], config["target_language"],
            lowercase=config.get("lowercase", False),
        )

    def get_config(self):
        return {
            "kind": KIND, "vocabulary_size": self.vocabulary_size, "ids": self.id_map.get_config(),
            "source_language": self.source_language, "target_language": self.target_language,
            "lowercase": self.lowercase,
        }

    def save(self, directory):
        """Copies the vocabularies and merges into `directory`, with
        `tokenizer.json` (the kind, the ids and the languages)."""
        os.makedirs(directory, exist_ok=True)
        if os.path.abspath(self.directory) != os.path.abspath(directory):
            for name in self.FILES:
                shutil.copyfile(os.path.join(self.directory, name), os.path.join(directory, name))
        write_atomically(os.path.join(directory, "tokenizer.json"), json.dumps(self.get_config(), indent=2))

    def fingerprint(self):
        digest = hashlib.sha256(json.dumps(self.get_config(), sort_keys=True).encode())
        for name in self.FILES:
            with open(os.path.join(self.directory, name), "rb") as file:
                digest.update(file.read())
        return digest.hexdigest()[:16]

    def bpe(self, word):
        """The BPE pieces of one Moses token, the last marked `</w>`: the
        best-ranked adjacent pair merged everywhere, until none is ranked."""
        pieces = self._pieces.get(word)
        if pieces is not None:
            return pieces
        symbols = list(word[:-1]) + [word[-1] + END_OF_WORD]
        while len(symbols) > 1:
            ranked = [(self._ranks[pair], pair) for pair in zip(symbols, symbols[1:]) if pair in self._ranks]
            if not ranked:
                break
            pair = min(ranked)[1]
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        if len(self._pieces) >= CACHE_SIZE:
            self._pieces.clear()
        self._pieces[word] = pieces = tuple(symbols)
        return pieces

    def pieces(self, text, target=False):
        """The BPE pieces of a source text (a target text with
        `target=True`), special tokens kept whole."""
        normalizer, tokenizer = self._moses[self.target_language if target else self.source_language]
        pieces = []
        for part in SPECIAL_PATTERN.split(text):
            if part in SPECIAL_TOKENS:
                pieces.append(part)
                continue
            if self.lowercase:
                part = part.lower()
            tokens = tokenizer.tokenize(
                normalize(part, normalizer), aggressive_dash_splits=True, return_str=False, escape=True
            )
            for token in tokens:
                if token:
                    pieces.extend(self.bpe(token))
        return pieces

    def published_ids(self, text, target=False):
        """The published ids of `text`, without EOS: `FSMTTokenizer`'s
        `input_ids` before its `</s>`, before our mapping."""
        vocabulary = self.target_vocabulary if target else self.source_vocabulary
        unknown = vocabulary.get("<unk>", self._published_unknown)
        return [vocabulary.get(piece, unknown) for piece in self.pieces(text, target)]

    def tokenize(self, strings, num_threads=None, target=False):
        """Our ids of each source string (each target string with
        `target=True`), without BOS or EOS. Moses runs in Python, one
        string at a time: `num_threads` is not used."""
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
            return [self._detokenize_row(row) for row in ids]
        return self._detokenize_row(ids)

    def _detokenize_row(self, ids):
        published = [i for i in self.id_map.to_published([int(i) for i in ids]) if i not in self._published_special]
        # An id the target vocabulary lacks reads "<unk>", as in FSMT.
        text = "".join(self._target_pieces.get(i, "<unk>").replace(END_OF_WORD, " ") for i in published)
        return self._detokenizer.detokenize(text.split())

    def id_to_piece(self, ids):
        """The target piece of each of our ids, for display."""
        return [self._target_pieces.get(i, "<unk>") for i in self.id_map.to_published(np.asarray(ids).reshape(-1))]
