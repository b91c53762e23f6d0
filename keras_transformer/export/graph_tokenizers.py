"""A translator's tokenizer as TensorFlow ops, for the exported graph.

Our vocabulary runs through tensorflow-text's SentencePiece op. Marian's
(a converted OPUS-MT translator) runs its source SentencePiece model
through the same op and maps SentencePiece's ids to Marian's, and Marian's
to ours, with constant tables. A tokenizer with no TensorFlow op (fairseq's
Moses) is refused in one line.
"""

import json

import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer.data.marian_tokenizer import MarianTokenizer
from keras_transformer.data.tokenizer import SPACE_MARK
from keras_transformer.data.tokenizer import SubwordTokenizer

SUBWORD_ASSET = "subword.model"


def graph_tokenizer(tokenizer):
    """The graph twin of `tokenizer`, a `SubwordTokenizer` or a
    `MarianTokenizer`."""
    if isinstance(tokenizer, SubwordTokenizer):
        return SubwordGraphTokenizer(tokenizer)
    if isinstance(tokenizer, MarianTokenizer):
        return MarianGraphTokenizer(tokenizer)
    if hasattr(tokenizer, "with_languages"):
        raise ValueError(
            "export's signatures take text alone, and a multilingual translator (M2M-100, NLLB-200) needs its "
            "languages with each request, which they do not take yet; serve it with `keras-transformer serve` "
            "or Translator in Python."
        )
    raise ValueError(
        f"export runs the tokenizer inside the graph, and a {type(tokenizer).__name__} has no TensorFlow op "
        "(Moses tokenization is Python). Expected our SentencePiece vocabulary or a converted Marian "
        "translator's; serve this translator with Translator in Python."
    )


def detokenize_exactly(sentencepiece_op, ids):
    """Text from `[batch, None]` ragged ids, with the spaces it began with.

    The graph twin of `SubwordTokenizer.detokenize`: `sentencepiece_op` is a
    `tensorflow_text.SentencepieceTokenizer`. Padding, BOS and EOS ids are
    dropped; SentencePiece decodes the rest, and the leading spaces its
    decoder drops (the marks after the first) are put back.
    """
    kept = tf.ragged.boolean_mask(
        ids,
        (ids != SubwordTokenizer.padding_id)
        & (ids != SubwordTokenizer.bos_id)
        & (ids != SubwordTokenizer.eos_id),
    )
    text = sentencepiece_op.detokenize(kept)
    pieces = tf.strings.reduce_join(sentencepiece_op.id_to_string(kept), axis=-1)
    marks = tf.strings.regex_replace(pieces, f"(?s)^{SPACE_MARK}({SPACE_MARK}*).*$", r"\1")
    marks = tf.where(tf.strings.regex_full_match(pieces, f"(?s){SPACE_MARK}.*"), marks, "")
    return tf.strings.regex_replace(marks, SPACE_MARK, " ") + text


class SubwordGraphTokenizer(tf.Module):
    """Our shared SentencePiece vocabulary."""

    def __init__(self, tokenizer):
        super().__init__()
        self.proto = tokenizer.proto
        self.op = tensorflow_text.SentencepieceTokenizer(model=tokenizer.proto, out_type=tf.int32)

    def assets(self):
        return {SUBWORD_ASSET: self.proto}

    def pieces(self):
        processor = sentencepiece.SentencePieceProcessor(model_proto=self.proto)
        return [processor.id_to_piece(i) for i in range(processor.vocab_size())]

    def tokenize(self, text):
        return self.op.tokenize(text)

    def detokenize(self, ids):
        return detokenize_exactly(self.op, ids)


class MarianGraphTokenizer(tf.Module):
    """Marian's: the source SentencePiece model, then `vocab.json`'s ids
    mapped to ours; a leading `>>xx<<` is one token. Detokenizing joins the
    target pieces and turns SentencePiece's space marks into spaces, as
    transformers' `MarianTokenizer.decode` does."""

    def __init__(self, tokenizer):
        super().__init__()
        # The files, and the id map, for clients of the ids signature.
        self.files = dict(tokenizer.files) | {"tokenizer.json": json.dumps({"ids": tokenizer.id_map.get_config()}).encode()}
        self.op = tensorflow_text.SentencepieceTokenizer(model=self.files["source.spm"], out_type=tf.int32)
        processor = sentencepiece.SentencePieceProcessor(model_proto=self.files["source.spm"])
        self.source_pieces = [processor.id_to_piece(i) for i in range(processor.vocab_size())]
        id_map, vocabulary = tokenizer.id_map, tokenizer.source_vocabulary
        unknown = id_map.special["unknown"]
        # SentencePiece's id -> ours: its piece's id in vocab.json, or unknown.
        self.ours_of_piece = tf.constant(id_map.to_ours([vocabulary.get(p, unknown) for p in self.source_pieces]), tf.int32)
        self.codes = [piece for piece in vocabulary if piece.startswith(">>") and piece.endswith("<<")]
        self.code_ids = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.codes or [">><<"], tf.string),
                tf.constant(id_map.to_ours([vocabulary[code] for code in self.codes]) or [tokenizer.unknown_id], tf.int32),
            ),
            default_value=tokenizer.unknown_id,
        )
        # Our id -> its target piece; our special ids have none.
        self.target_pieces = tf.constant(
            ["" if i < 4 else piece for i, piece in enumerate(tokenizer.id_to_piece(range(tokenizer.vocabulary_size)))]
        )

    def assets(self):
        return self.files

    def pieces(self):
        return self.source_pieces + self.codes

    def tokenize(self, text):
        coded = tf.strings.regex_full_match(text, "(?s)>>.*?<<.*")
        code = tf.where(coded, tf.strings.regex_replace(text, "(?s)^(>>.*?<<).*$", r"\1"), "")
        rest = tf.where(coded, tf.strings.regex_replace(text, "(?s)^>>.*?<<", ""), text)
        ids = tf.gather(self.ours_of_piece, self.op.tokenize(rest))
        code_ids = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(self.code_ids.lookup(code), coded), tf.cast(coded, tf.int64)
        )
        return tf.concat([code_ids, ids], axis=1)

    def detokenize(self, ids):
        pieces = tf.gather(self.target_pieces, tf.ragged.boolean_mask(ids, ids > MarianTokenizer.eos_id))
        text = tf.strings.regex_replace(tf.strings.reduce_join(pieces, axis=-1), SPACE_MARK, " ")
        return tf.strings.strip(text)
