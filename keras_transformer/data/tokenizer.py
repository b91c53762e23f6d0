"""A subword vocabulary shared by source and target, section 5.1."""

import io
import json
import os
import threading

import numpy as np
import sentencepiece

from keras_transformer.data.corpus import read_json_object
from keras_transformer.files import write_atomically

MODEL_FILE = "subword.model"
CONFIG_FILE = "subword.json"
# SentencePiece writes a space as this mark and begins every text with one
# (its "dummy prefix"). Its decoder drops every mark a text begins with, so
# the spaces a text began with are in the pieces but not in the decoded text.
SPACE_MARK = "\u2581"


# Sampling seeds SentencePiece's one generator, then draws: one at a time.
_SAMPLING = threading.Lock()


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
    """Byte-pair encoding shared by both languages, on SentencePiece.

    The paper encoded WMT14 English-German "using byte-pair encoding, which
    has a shared source-target vocabulary of about 37000 tokens". This class
    trains such a vocabulary with SentencePiece (BPE by default) and
    tokenizes with the `sentencepiece` library on every core, with no
    TensorFlow. The exported SavedModel runs the same model file through
    tensorflow-text's op (`keras_transformer.export`).

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
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=self.proto)
        self.vocabulary_size = self._processor.vocab_size()

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
        """Writes `subword.model` and `subword.json` into `directory`, each
        through a temporary file, so a crash leaves no torn vocabulary."""
        os.makedirs(directory, exist_ok=True)
        write_atomically(os.path.join(directory, MODEL_FILE), self.proto)
        write_atomically(
            os.path.join(directory, CONFIG_FILE),
            json.dumps(
                {
                    "vocabulary_size": self.vocabulary_size,
                    "padding_id": self.padding_id,
                    "unknown_id": self.unknown_id,
                    "bos_id": self.bos_id,
                    "eos_id": self.eos_id,
                },
                indent=2,
            ),
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
        if not proto:
            raise ValueError(
                f"{model_path} is empty: a write of it was cut short, or it was "
                "overwritten. Expected the file SubwordTokenizer.save writes."
            )
        try:
            tokenizer = cls(proto)
        except RuntimeError as error:  # SentencePiece's parse failure
            raise ValueError(
                f"{model_path} cannot be read as a SentencePiece model "
                f"({str(error).strip().splitlines()[0] if str(error).strip() else 'empty'}). "
                "Expected the file SubwordTokenizer.save writes; it may be "
                "truncated or overwritten."
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

    def fingerprint(self):
        """A short hash of the vocabulary, to tell data tokenized by it."""
        import hashlib

        return hashlib.sha256(self.proto).hexdigest()[:16]

    def tokenize(self, strings, num_threads=None):
        """Subword ids of each string, without BOS or EOS.

        Args:
            strings: a string, or a sequence of strings.
            num_threads: threads for a sequence (default: every core).

        Returns:
            A list of int ids for one string, a list of such lists for a
            sequence.
        """
        if isinstance(strings, str):
            return self._processor.encode(strings)
        strings = list(strings)
        for index, text in enumerate(strings):
            if not isinstance(text, str):
                raise TypeError(
                    f"`strings[{index}]` must be a str. Received: "
                    f"{type(text).__name__} {text!r:.60}"
                )
        return self._processor.encode(strings, num_threads=num_threads or os.cpu_count() or 1)

    def sample(self, strings, alpha, seed):
        """Ids of each string, in a segmentation drawn at random (subword
        regularization, Kudo 2018; for BPE, BPE-dropout: each merge left
        out with probability `alpha`, Provilkov et al. 2020). The same
        `seed` draws the same segmentations.

        Returns:
            A list of int-id lists, one per string.
        """
        with _SAMPLING:  # SentencePiece's generator is one for the process
            sentencepiece.set_random_generator_seed(int(seed) % 2**32)
            return self._processor.encode(
                list(strings), enable_sampling=True, alpha=float(alpha), nbest_size=-1, num_threads=1
            )

    def tokenize_target(self, strings, num_threads=None):
        """The target side's ids: the shared vocabulary's, as `tokenize`."""
        return self.tokenize(strings, num_threads)

    def detokenize(self, ids):
        """Text from ids; padding, BOS and EOS ids are dropped.

        Args:
            ids: 1-D ids (a list or array), or `[batch, length]` ids (a list
                of lists, or an array padded with 0).

        Returns:
            A string for 1-D ids, a list of strings otherwise.
        """
        if isinstance(ids, np.ndarray) or hasattr(ids, "shape"):
            ids = np.asarray(ids).tolist()
        ids = list(ids)
        if ids and not isinstance(ids[0], (int, np.integer)):
            return [self._detokenize_row(row) for row in ids]
        return self._detokenize_row(ids)

    def _detokenize_row(self, ids):
        dropped = (self.padding_id, self.bos_id, self.eos_id)
        kept = [int(i) for i in ids if i not in dropped]
        text = self._processor.decode(kept)
        marks = 0  # the space marks the text begins with: only its first pieces
        for piece in map(self._processor.id_to_piece, kept):
            rest = piece.lstrip(SPACE_MARK)
            marks += len(piece) - len(rest)
            if rest:
                break
        # The first mark is the dummy prefix, the others were spaces; some
        # SentencePiece versions decode those spaces, others drop them.
        kept_spaces = len(text) - len(text.lstrip(" "))
        return " " * max(marks - 1 - kept_spaces, 0) + text

    def id_to_piece(self, ids):
        """The subword piece of each id, for display."""
        return [self._processor.id_to_piece(int(i)) for i in np.asarray(ids).reshape(-1)]
