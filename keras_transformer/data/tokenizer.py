"""A subword vocabulary shared by source and target, section 5.1."""

import io
import json
import os

import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer.data.corpus import read_json_object

MODEL_FILE = "subword.model"
CONFIG_FILE = "subword.json"
# SentencePiece writes a space as this mark and begins every text with one
# (its "dummy prefix"). Its decoder drops every mark a text begins with, so
# the spaces a text began with are in the pieces but not in the decoded text.
SPACE_MARK = "\u2581"


def detokenize_exactly(sentencepiece_op, ids):
    """Text from `[batch, None]` ragged ids, with the spaces it began with.

    A graph function, shared by `SubwordTokenizer.detokenize` and the
    exported SavedModel: `sentencepiece_op` is a
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


def _sentences_of(item, index):
    """The sentence, or both sides of the pair, that `texts[index]` holds."""
    if isinstance(item, str):
        return (item,)
    try:  # bytes would iterate as ints
        sides = None if isinstance(item, (bytes, bytearray)) else tuple(item)
    except TypeError:
        sides = None
    wrong = [item] if sides is None else [s for s in sides if not isinstance(s, str)]
    if wrong:
        raise TypeError(
            f"`texts[{index}]` must be a sentence (str) or a pair of "
            f"sentences. Received: {type(wrong[0]).__name__} {wrong[0]!r:.60}"
        )
    return sides


class SubwordTokenizer:
    """Byte-pair encoding shared by both languages, on TensorFlow graph ops.

    The paper encoded WMT14 English-German "using byte-pair encoding, which
    has a shared source-target vocabulary of about 37000 tokens". This class
    trains such a vocabulary with SentencePiece (BPE by default) and
    tokenizes with `tensorflow_text.SentencepieceTokenizer`, a TF op, so the
    same tokenizer runs in `tf.data` and inside an exported SavedModel.

    Text is kept exactly: no Unicode normalization, no whitespace collapsing
    (leading, inner or trailing), and characters outside the vocabulary fall
    back to their UTF-8 bytes instead of becoming an unknown token. So
    `detokenize(tokenize(line))` gives back `line`, and sacrebleu can score
    detokenized output as it is.

    Ids 0 to 3 are fixed: `padding_id`, `unknown_id`, `bos_id`, `eos_id`.

    Args:
        proto: the serialized SentencePiece model, as bytes.
    """

    padding_id = 0
    unknown_id = 1
    bos_id = 2
    eos_id = 3

    def __init__(self, proto):
        self.proto = bytes(proto)
        self.vocabulary_size = sentencepiece.SentencePieceProcessor(
            model_proto=self.proto
        ).vocab_size()
        # Fixed signatures: one trace each, whatever the batch.
        self._tokenize = tf.function(
            lambda strings: self._graph_tokenizer().tokenize(strings),
            input_signature=[tf.TensorSpec([None], tf.string)],
        )
        self._detokenize = tf.function(
            lambda ids: detokenize_exactly(self._graph_tokenizer(), ids),
            input_signature=[tf.RaggedTensorSpec([None, None], tf.int32, 1)],
        )
        self._id_to_piece = tf.function(
            lambda ids: self._graph_tokenizer().id_to_string(ids),
            input_signature=[tf.TensorSpec([None], tf.int32)],
        )

    def _graph_tokenizer(self):
        # Made inside each traced graph, which then owns its copy of the
        # model. A tokenizer made eagerly keeps the model in TensorFlow's
        # eager kernel cache, which `tf.random.set_seed` (and so
        # `keras.utils.set_random_seed`) clears, breaking the tokenizer.
        return tensorflow_text.SentencepieceTokenizer(
            model=self.proto, out_type=tf.int32
        )

    @classmethod
    def train(
        cls,
        texts,
        vocabulary_size,
        model_type="bpe",
        character_coverage=0.9999,
        max_sentences=5_000_000,
        seed=0,
    ):
        """Trains a vocabulary on sentences of both languages.

        Args:
            texts: an iterable of sentences, or of (source, target) pairs such
                as a `ParallelCorpus`; both sides of a pair are used.
            vocabulary_size: the number of subword ids, including the four
                special ids and the 256 byte pieces.
            model_type: `"bpe"` (the paper's) or `"unigram"`.
            character_coverage: the share of characters that get their own
                piece; the rarest others are spelled in bytes.
            max_sentences: SentencePiece trains on a random sample of at most
                this many sentences.
            seed: the seed of that sample.

        Returns:
            A `SubwordTokenizer`.
        """
        # The four special ids and the 256 byte pieces, and one more.
        least = 4 + 256 + 1
        if (
            isinstance(vocabulary_size, bool)
            or not isinstance(vocabulary_size, int)
            or vocabulary_size < least
        ):
            raise ValueError(
                f"vocabulary_size must be an integer >= {least} (4 special ids "
                "and 256 byte pieces come first). Received: "
                f"vocabulary_size={vocabulary_size!r}"
            )
        if isinstance(texts, (str, bytes)):
            raise TypeError(
                "`texts` must be an iterable of sentences or of (source, "
                "target) pairs. Received a single "
                f"{type(texts).__name__} of length {len(texts)}; wrap it "
                "in a list to train on one sentence."
            )
        sentences = [
            sentence
            for index, item in enumerate(texts)
            for sentence in _sentences_of(item, index)
            if sentence.strip()
        ]
        if not sentences:
            raise ValueError(
                "Training a vocabulary needs at least one non-empty sentence. "
                "Received: no text"
            )
        model = io.BytesIO()
        sentencepiece.set_random_generator_seed(seed)
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=model,
                vocab_size=vocabulary_size,
                model_type=model_type,
                pad_id=cls.padding_id,
                unk_id=cls.unknown_id,
                bos_id=cls.bos_id,
                eos_id=cls.eos_id,
                byte_fallback=True,
                character_coverage=character_coverage,
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                split_digits=True,
                input_sentence_size=max_sentences,
                shuffle_input_sentence=True,
                max_sentence_length=1 << 16,
                num_threads=os.cpu_count() or 1,
                minloglevel=2,
            )
        except RuntimeError as error:
            raise ValueError(
                f"SentencePiece could not train a vocabulary of "
                f"{vocabulary_size} {model_type} tokens on "
                f"{len(sentences)} sentences: {error}"
            ) from error
        return cls(model.getvalue())

    def save(self, directory):
        """Writes `subword.model` and `subword.json` into `directory`."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, MODEL_FILE), "wb") as file:
            file.write(self.proto)
        with open(os.path.join(directory, CONFIG_FILE), "w") as file:
            json.dump(
                {
                    "vocabulary_size": self.vocabulary_size,
                    "padding_id": self.padding_id,
                    "unknown_id": self.unknown_id,
                    "bos_id": self.bos_id,
                    "eos_id": self.eos_id,
                },
                file,
                indent=2,
            )

    @classmethod
    def load(cls, directory):
        """Reads a tokenizer written by `save`."""
        model_path = os.path.join(directory, MODEL_FILE)
        if not os.path.isfile(model_path):
            raise FileNotFoundError(
                f"No tokenizer in {directory}: expected {MODEL_FILE} (and "
                f"{CONFIG_FILE}) written by SubwordTokenizer.save."
            )
        with open(model_path, "rb") as file:
            proto = file.read()
        try:
            tokenizer = cls(proto)
        except RuntimeError as error:  # SentencePiece's parse failure
            raise ValueError(
                f"{model_path} cannot be read as a SentencePiece model "
                f"({str(error).strip().splitlines()[0]}). Expected the file "
                "SubwordTokenizer.save writes; it may be truncated or "
                "overwritten."
            ) from None
        config_path = os.path.join(directory, CONFIG_FILE)
        if os.path.isfile(config_path):
            config = read_json_object(config_path)
            if config.get("vocabulary_size") != tokenizer.vocabulary_size:
                raise ValueError(
                    f"{config_path} says vocabulary_size="
                    f"{config.get('vocabulary_size')}, but {model_path} has "
                    f"{tokenizer.vocabulary_size} pieces; the two files do "
                    "not belong together."
                )
        return tokenizer

    def tokenize(self, strings):
        """Subword ids of each string, without BOS or EOS.

        Works eagerly, in `tf.data` and in `tf.function` graphs.

        Args:
            strings: a string, or a list or 1-D tensor of strings.

        Returns:
            int32 ids: a 1-D tensor for one string, a `tf.RaggedTensor`
            `[batch, None]` for several.
        """
        strings = tf.convert_to_tensor(strings, tf.string)
        if strings.shape.rank == 0:
            return self._tokenize(strings[None])[0]
        return self._tokenize(strings)

    def detokenize(self, ids):
        """Text from ids; padding, BOS and EOS ids are dropped.

        Args:
            ids: 1-D ids, or `[batch, length]` ids (dense with padding, or
                ragged).

        Returns:
            A string tensor: a scalar for 1-D ids, `[batch]` otherwise.
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.convert_to_tensor(ids, tf.int32)
            if ids.shape.rank == 1:
                return self.detokenize(ids[None])[0]
            ids = tf.RaggedTensor.from_tensor(ids)
        return self._detokenize(tf.cast(ids, tf.int32))

    def id_to_piece(self, ids):
        """The subword piece of each id, for display."""
        return self._id_to_piece(tf.reshape(tf.convert_to_tensor(ids, tf.int32), [-1]))
