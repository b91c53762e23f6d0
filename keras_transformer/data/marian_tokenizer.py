"""Marian's tokenizer (OPUS-MT): two SentencePiece models and a vocabulary.

Marian splits the source with `source.spm` and the target with
`target.spm`, and numbers the pieces with `vocab.json` (one vocabulary for
both sides, or `target_vocab.json` for the target), not with SentencePiece's
own ids. Multilingual models take a target-language token such as
`>>deu<<` at the start of the source. The ids are then mapped onto ours
(`IdMap`).
"""

import sentencepiece

from keras_transformer.data.converted_tokenizer import ConvertedTokenizer
from keras_transformer.data.converted_tokenizer import read_vocabulary

SPACE_MARK = "\u2581"


class MarianTokenizer(ConvertedTokenizer):
    """Marian's tokenization, with our ids.

    Args:
        files: the contents (bytes) of `source.spm`, `target.spm`,
            `vocab.json` and, for separate vocabularies, `target_vocab.json`,
            by name.
        id_map: the `IdMap` from Marian's ids to ours.

    Our ids around Marian's: `ConvertedTokenizer`.
    """

    KIND = "marian"
    FILES = ("source.spm", "target.spm", "vocab.json")
    OPTIONAL_FILES = ("target_vocab.json",)

    def __init__(self, files, id_map):
        super().__init__(files, id_map)
        self._source = sentencepiece.SentencePieceProcessor(model_proto=files["source.spm"])
        self._target = sentencepiece.SentencePieceProcessor(model_proto=files["target.spm"])
        self.source_vocabulary = read_vocabulary(files["vocab.json"], "vocab.json")
        self.separate_vocabularies = "target_vocab.json" in files
        self.target_vocabulary = (
            read_vocabulary(files["target_vocab.json"], "target_vocab.json")
            if self.separate_vocabularies else self.source_vocabulary
        )
        self._target_pieces = {i: piece for piece, i in self.target_vocabulary.items()}

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

    def published_text(self, published):
        """The target text of Marian's ids, special ones dropped."""
        pieces = [self._target_pieces.get(i, "") for i in published]
        # transformers decodes a shared vocabulary's pieces with the source
        # model; the pieces, not the model, make the text.
        processor = self._target if self.separate_vocabularies else self._source
        return processor.decode_pieces(pieces).replace(SPACE_MARK, " ").strip()
