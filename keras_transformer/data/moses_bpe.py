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

The merges are applied by our loop (`bpe`), not subword-nmt's
`apply_bpe`. Both give the same pieces: every occurrence of the best
ranked pair merged, left to right, until no pair has a rank. Measured on
1,558 lines of English prose (55,000 Moses tokens, 2,717 distinct), both
take a few hundredths of a second, under a tenth of what Moses'
tokenization takes, ours half of subword-nmt's once its "@@" pieces are
respelt as FSMT's. Ours also reads `merges.txt` as `FSMTTokenizer` does
(a pair listed twice keeps its later rank; subword-nmt keeps the first)
and needs no codes header to tell its end-of-word convention.
"""

import re
import unicodedata

from keras_transformer.data.converted_tokenizer import ConvertedTokenizer
from keras_transformer.data.converted_tokenizer import read_vocabulary

END_OF_WORD = "</w>"
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")
SPECIAL_PATTERN = re.compile("(" + "|".join(map(re.escape, SPECIAL_TOKENS)) + ")")
# Moses' replace-unicode-punctuation.perl, character by character; "。"
# and "．" also take the spaces after them (below).
UNICODE_PUNCTUATION = str.maketrans({
    "，": ",", "、": ",", "”": '"', "“": '"', "∶": ":", "：": ":", "？": "?", "《": '"', "》": '"',
    "）": ")", "！": "!", "（": "(", "；": ";", "」": '"', "「": '"', "～": "~", "’": "'", "…": "...",
    "━": "-", "〈": "<", "〉": ">", "【": "[", "】": "]", "％": "%",
    **{chr(0xFF10 + digit): str(digit) for digit in range(10)},  # full-width digits
})
FULL_STOPS = re.compile(r"[。．]\s*")
# Words whose pieces are remembered; a corpus of many more starts afresh.
CACHE_SIZE = 200_000


def read_merges(content):
    """The rank of each merge of `merges.txt` ("first second" a line).

    As `FSMTTokenizer` reads it: the text after the last newline is not
    a merge, and a pair listed twice takes its later rank."""
    lines = content.decode("utf-8").split("\n")[:-1]
    return {tuple(line.split()[:2]): rank for rank, line in enumerate(lines)}


def normalize(text, punctuation_normalizer):
    """Moses' normalization before tokenizing: Unicode punctuation to
    ASCII, `normalize-punctuation.perl`, non-printing characters out."""
    text = FULL_STOPS.sub(". ", text.translate(UNICODE_PUNCTUATION))
    text = punctuation_normalizer.normalize(text)
    return "".join(char for char in text if not unicodedata.category(char).startswith("C"))


class MosesBpeTokenizer(ConvertedTokenizer):
    """fairseq's Moses and BPE tokenization, with our ids.

    Args:
        files: the contents (bytes) of `vocab-src.json`, `vocab-tgt.json`
            and `merges.txt`, by name.
        id_map: the `IdMap` from the published ids to ours.
        source_language, target_language: Moses' language codes of the
            source and target texts, such as "en" and "de".
        lowercase: lowercase texts before tokenizing (FSMT's
            `do_lower_case`, for models trained on lowercased text).

    Our ids around fairseq's: `ConvertedTokenizer`.
    """

    KIND = "moses_bpe"
    FILES = ("vocab-src.json", "vocab-tgt.json", "merges.txt")
    SETTINGS = ("source_language", "target_language", "lowercase")

    def __init__(self, files, id_map, source_language, target_language, lowercase=False):
        from sacremoses import MosesDetokenizer
        from sacremoses import MosesPunctNormalizer
        from sacremoses import MosesTokenizer

        super().__init__(files, id_map)
        self.source_language = source_language
        self.target_language = target_language
        self.lowercase = bool(lowercase)
        self.source_vocabulary = read_vocabulary(files["vocab-src.json"], "vocab-src.json")
        self.target_vocabulary = read_vocabulary(files["vocab-tgt.json"], "vocab-tgt.json")
        self._target_pieces = {i: piece for piece, i in self.target_vocabulary.items()}
        self._ranks = read_merges(files["merges.txt"])
        self._moses = {
            language: (MosesPunctNormalizer(lang=language), MosesTokenizer(lang=language))
            for language in (source_language, target_language)
        }
        self._detokenizer = MosesDetokenizer(lang=target_language)
        self._pieces = {}
        # Detokenizing drops <s> too, as FSMT's `decode` does.
        self.published_special |= {
            self.target_vocabulary[token] for token in SPECIAL_TOKENS if token in self.target_vocabulary
        }

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

    def published_text(self, published):
        """The target text of fairseq's ids, special ones dropped."""
        # An id the target vocabulary lacks reads "<unk>", as in FSMT.
        text = "".join(self._target_pieces.get(i, "<unk>").replace(END_OF_WORD, " ") for i in published)
        return self._detokenizer.detokenize(text.split())
