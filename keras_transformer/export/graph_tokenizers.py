"""A translator's tokenizer as TensorFlow ops, for the exported graph.

Our vocabulary runs through tensorflow-text's SentencePiece op. Marian's
(a converted OPUS-MT translator) runs its source SentencePiece model
through the same op and maps SentencePiece's ids to Marian's, and Marian's
to ours, with constant tables; M2M-100's and NLLB-200's likewise, after
the token of a language that each request names. A tokenizer with no
TensorFlow op (fairseq's Moses) is refused in one line.
"""

import json

import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer.data.marian_tokenizer import MarianTokenizer
from keras_transformer.data.multilingual_tokenizer import SPM
from keras_transformer.data.multilingual_tokenizer import MultilingualTokenizer
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
    if isinstance(tokenizer, MultilingualTokenizer):
        return MultilingualGraphTokenizer(tokenizer)
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
        self.op, self.source_pieces, self.ours_of_piece = numbered_pieces(
            self.files["source.spm"], tokenizer.source_vocabulary, tokenizer.id_map
        )
        id_map, vocabulary = tokenizer.id_map, tokenizer.source_vocabulary
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
        return joined_pieces(self.target_pieces, ids)


def numbered_pieces(proto, vocabulary, id_map):
    """A converted tokenizer's SentencePiece op, its pieces, and our id of
    each piece: its id in the published `vocabulary`, or unknown."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    pieces = [processor.id_to_piece(i) for i in range(processor.vocab_size())]
    unknown = id_map.special["unknown"]
    ours = tf.constant(id_map.to_ours([vocabulary.get(piece, unknown) for piece in pieces]), tf.int32)
    return tensorflow_text.SentencepieceTokenizer(model=proto, out_type=tf.int32), pieces, ours


def joined_pieces(target_pieces, ids):
    """The text of our ragged `ids`: their pieces (`target_pieces`, "" for
    special ids) joined, space marks as spaces, as transformers decodes."""
    text = tf.strings.regex_replace(tf.strings.reduce_join(tf.gather(target_pieces, ids), axis=-1), SPACE_MARK, " ")
    return tf.strings.strip(text)


class MultilingualGraphTokenizer(tf.Module):
    """M2M-100's and NLLB-200's: the language's token, then the SentencePiece
    model's pieces numbered by `vocabulary.json` and mapped to ours (and
    NLLB's piece for a space at the end). A request names its languages
    per text; "" keeps the translator's pair."""

    def __init__(self, tokenizer):
        super().__init__()
        self.files = dict(tokenizer.files) | {"tokenizer.json": json.dumps(tokenizer.get_config()).encode()}
        id_map, vocabulary, unknown = tokenizer.id_map, tokenizer.vocabulary, tokenizer.id_map.special["unknown"]
        self.op, self.source_pieces, self.ours_of_piece = numbered_pieces(self.files[SPM], vocabulary, id_map)
        # Pieces as the text spells them (an unknown one too), for the space at the end.
        self.spelled = tensorflow_text.SentencepieceTokenizer(model=self.files[SPM], out_type=tf.string)
        self.trailing_space = tokenizer.trailing_space
        self.space_id = id_map.to_ours([vocabulary.get(SPACE_MARK, unknown)])[0]
        self.codes = list(tokenizer.languages)
        language_ids = id_map.to_ours([vocabulary[tokenizer.languages[code]] for code in self.codes])
        self.language_ids = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(self.codes), tf.constant(language_ids, tf.int32)), -1
        )
        self.pair = (tokenizer.source_language, tokenizer.target_language)
        # Our id -> its target piece; special ids, language tokens and ids
        # past the vocabulary (a config's spare rows) have none.
        dropped = set(language_ids) | set(range(4))
        spelled = {i: piece for piece, i in vocabulary.items()}
        published = id_map.to_published(range(tokenizer.vocabulary_size))
        self.target_pieces = tf.constant(["" if i in dropped else spelled.get(p, "") for i, p in enumerate(published)])

    def assets(self):
        return self.files

    def pieces(self):
        return self.source_pieces + self.codes

    def language_id(self, codes, side):
        """Our ids of the tokens of `codes` (string `[batch]`; "" for the
        translator's `side`, 0 source or 1 target); an unknown code fails
        the request."""
        ids = self.language_ids.lookup(tf.where(codes == "", self.pair[side], codes))
        known = tf.debugging.assert_non_negative(
            ids, message=f"Unknown language code: the model's are {', '.join(self.codes[:8])}, ... (assets/tokenizer.json)"
        )
        with tf.control_dependencies([known]):
            return tf.identity(ids)

    def tokenize(self, text, source_language=None):
        ids = tf.gather(self.ours_of_piece, self.op.tokenize(text))
        written = text != ""
        if self.trailing_space:  # a space mark before a letter put after the text: it ended in a space
            marked = tf.strings.reduce_join(self.spelled.tokenize(text + "x"), axis=-1)
            ends = written & tf.strings.regex_full_match(marked, f"(?s).*{SPACE_MARK}x")
            ids = tf.concat([ids, _one_where(ends, tf.fill(tf.shape(text), self.space_id))], axis=1)
        codes = tf.fill(tf.shape(text), "") if source_language is None else source_language
        return tf.concat([_one_where(written, self.language_id(codes, 0)), ids], axis=1)

    def detokenize(self, ids):
        return joined_pieces(self.target_pieces, ids)


def _one_where(condition, values):
    """A ragged `[batch, 0 or 1]`: `values[i]` where `condition[i]`."""
    return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(values, condition), tf.cast(condition, tf.int64))
