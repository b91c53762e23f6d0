"""The tokenizer of M2M-100 and NLLB-200: one SentencePiece model, one
vocabulary for both sides, and a token per language.

A source is its language's token, then its pieces; a target is the target
language's token, then its pieces (decoding forces that token first, as
transformers' `forced_bos_token_id` does). M2M-100 numbers pieces with
`vocab.json` and its language tokens (`__en__`) after them, in the order
of its list of languages; NLLB-200 numbers pieces and language tokens
(`eng_Latn`) in `tokenizer.json`. Either is read into one vocabulary of
pieces and language tokens, `vocabulary.json`, and mapped onto our ids
(`IdMap`).
"""

import difflib
import json
import os
import re

import sentencepiece

from keras_transformer.data.converted_tokenizer import ConvertedTokenizer
from keras_transformer.data.converted_tokenizer import read_vocabulary
from keras_transformer.data.corpus import read_json_object

# M2M-100's languages, in the order of their tokens' ids (fairseq's
# `language_pairs` of the 100-language model; "wmt21", its WMT21 models').
M2M100_LANGUAGES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi hr ht "
        "hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps "
        "pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"
    ).split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
# NLLB-200's codes: a language and a script, as "eng_Latn".
NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")
SPM = "sentencepiece.bpe.model"
SPACE_MARK = "\u2581"


def _settings(directory):
    path = os.path.join(directory, "tokenizer_config.json")
    return read_json_object(path) if os.path.isfile(path) else {}


def _require(directory, *names):
    for name in names:
        if not os.path.isfile(os.path.join(directory, name)):
            raise FileNotFoundError(f"No {name} in {directory}. Expected {list(names)}.")


def m2m100_vocabulary(directory):
    """M2M-100's pieces and language tokens by id, and its languages."""
    _require(directory, SPM, "vocab.json")
    with open(os.path.join(directory, "vocab.json"), "rb") as file:
        vocabulary = read_vocabulary(file.read(), "vocab.json")
    codes = _settings(directory).get("language_codes", "m2m100")
    if codes not in M2M100_LANGUAGES:
        raise ValueError(f"{directory}: language_codes={codes!r}; expected one of {sorted(M2M100_LANGUAGES)}.")
    languages = {code: f"__{code}__" for code in M2M100_LANGUAGES[codes]}
    first = len(vocabulary)  # transformers' rule: language tokens follow the pieces
    return vocabulary | {token: first + i for i, token in enumerate(languages.values())}, languages


def nllb_vocabulary(directory):
    """NLLB-200's pieces and added tokens by id (`tokenizer.json`), and its
    languages: the added tokens that are language codes."""
    _require(directory, SPM, "tokenizer.json")
    found = read_json_object(os.path.join(directory, "tokenizer.json"))
    model = found.get("model") if isinstance(found.get("model"), dict) else {}
    vocabulary = read_vocabulary(json.dumps(model.get("vocab")), "tokenizer.json's model.vocab")
    added = {token["content"]: token["id"] for token in found.get("added_tokens", []) if isinstance(token, dict)}
    languages = {code: code for code in added if NLLB_CODE.match(code)}
    if not languages:
        raise ValueError(f"{directory}/tokenizer.json adds no language code such as 'eng_Latn'.")
    return vocabulary | added, languages


class MultilingualTokenizer(ConvertedTokenizer):
    """M2M-100's and NLLB-200's tokenization, with our ids.

    Args:
        files: the contents (bytes) of `sentencepiece.bpe.model` and
            `vocabulary.json` (pieces and language tokens to published ids).
        id_map: the `IdMap` from published ids to ours.
        languages: `{code: token}` of every language the model has.
        source_language, target_language: codes among `languages`.
        trailing_space: a text that ends in a space ends in a piece of
            its own, as transformers' NLLB tokenizer (`tokenizer.json`)
            splits it, where SentencePiece drops the space.
    """

    KIND = "multilingual"
    FILES = (SPM, "vocabulary.json")
    SETTINGS = ("languages", "source_language", "target_language", "trailing_space")

    def __init__(self, files, id_map, languages, source_language, target_language, trailing_space=False):
        super().__init__(files, id_map)
        self.trailing_space = bool(trailing_space)
        self._pieces = sentencepiece.SentencePieceProcessor(model_proto=files[SPM])
        self.vocabulary = read_vocabulary(files["vocabulary.json"], "vocabulary.json")
        self.languages = dict(languages)
        missing = [token for token in self.languages.values() if token not in self.vocabulary]
        if missing:
            raise ValueError(f"The language token {missing[0]!r} has no id in vocabulary.json.")
        self.source_language = self.check_language(source_language, "source")
        self.target_language = self.check_language(target_language, "target")
        self.published_special |= {self.vocabulary[token] for token in self.languages.values()}
        self._target_pieces = {i: piece for piece, i in self.vocabulary.items()}

    @classmethod
    def from_published(cls, directory, id_map, source_language=None, target_language=None):
        """The tokenizer of a published M2M-100 (`vocab.json`) or NLLB-200
        (`tokenizer.json`) directory; languages default to its
        tokenizer_config.json's `src_lang` and `tgt_lang`."""
        m2m100 = os.path.isfile(os.path.join(directory, "vocab.json"))
        vocabulary, languages = (m2m100_vocabulary if m2m100 else nllb_vocabulary)(directory)
        settings = _settings(directory)
        with open(os.path.join(directory, SPM), "rb") as file:
            files = {SPM: file.read(), "vocabulary.json": json.dumps(vocabulary).encode()}
        return cls(files, id_map, languages, source_language or settings.get("src_lang"),
                   target_language or settings.get("tgt_lang"), trailing_space=not m2m100)

    def check_language(self, code, side):
        """`code` if the model has it; else an error naming the nearest, or
        asking for one where none was given."""
        if code in self.languages:
            return code
        if code is None:
            key = "src_lang" if side == "source" else "tgt_lang"
            raise ValueError(
                f"No {side} language was given, and the checkpoint's tokenizer_config.json names none ({key}). "
                f"Expected one of the model's {len(self.languages)} codes, such as "
                f"{', '.join(list(self.languages)[:3])}: convert's --{side}-language CODE ({side}_language= in Python)."
            )
        nearest = difflib.get_close_matches(str(code), list(self.languages), n=5, cutoff=0.4)
        raise ValueError(
            f"The {side} language must be one of the model's {len(self.languages)} codes"
            f"{' (nearest: ' + ', '.join(nearest) + ')' if nearest else ''}. Received: {code!r}"
        )

    def with_languages(self, source_language=None, target_language=None):
        """This tokenizer for another pair (None keeps a side's)."""
        return type(self)(self.files, self.id_map, self.languages, source_language or self.source_language,
                          target_language or self.target_language, self.trailing_space)

    def published_ids(self, text, target=False):
        """The published ids of `text` after its language's token, without
        EOS: what transformers' tokenizer gives, before our mapping."""
        language = self.languages[self.target_language if target else self.source_language]
        pieces = self._pieces.encode(text, out_type=str)
        # It ends in a space (or in what normalizes to one) if a letter put after it follows a space mark.
        if self.trailing_space and text and self._pieces.normalize(text + "x").endswith(SPACE_MARK + "x"):
            pieces.append(SPACE_MARK)
        return [self.vocabulary[language]] + [self.vocabulary.get(piece, self._published_unknown) for piece in pieces]

    def published_text(self, published):
        """The text of published ids, special ones dropped."""
        return self._pieces.decode_pieces([self._target_pieces.get(i, "") for i in published]).strip()
