import os

import numpy as np
import pytest

from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import read_parallel_text

from conftest import MULTI30K, needs_multi30k

TRAINING_TEXT = [
    "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "A man rides a bicycle through the city.",
    "Zwei Hunde spielen im Garten.",
    "Two dogs play in the garden.",
] * 40


@pytest.fixture(scope="module")
def tokenizer():
    return SubwordTokenizer.train(TRAINING_TEXT, vocabulary_size=360)


def test_round_trip_is_exact_even_for_unseen_characters(tokenizer):
    lines = [
        "Zwei Hunde spielen im Garten.",
        "Two  spaces,\ta tab, and trailing space ",
        "Straße, Ärger, naïve café — “quotes” 日本語 🙂",
        "Numbers 12345 and 3.14",
        # Leading spaces, which SentencePiece's own decoder drops.
        " one leading space",
        "   three, then a tab\t",
        " ",
        "\u3000ideographic and\u00a0no-break spaces",
        "",
    ]
    ids = tokenizer.tokenize(lines)
    assert tokenizer.detokenize(ids) == lines
    # Characters never seen in training become bytes, not <unk>.
    assert tokenizer.unknown_id not in [i for row in ids for i in row]


def test_special_ids_are_fixed_and_dropped_by_detokenize(tokenizer):
    assert (tokenizer.padding_id, tokenizer.unknown_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    ids = tokenizer.tokenize("Two dogs play.")
    assert not set(ids) & {0, 2, 3}
    padded = np.concatenate([[tokenizer.bos_id], ids, [tokenizer.eos_id, 0, 0]])
    assert tokenizer.detokenize(padded[None]) == ["Two dogs play."]
    # ... also before the leading spaces they keep.
    ids = tokenizer.tokenize("  Two dogs.")
    padded = np.concatenate([[tokenizer.bos_id], ids, [tokenizer.eos_id, 0]])
    assert tokenizer.detokenize(padded) == "  Two dogs."


def test_shared_vocabulary_covers_both_languages(tokenizer):
    """Words of either language get merged pieces, not one per character."""
    for word in ("Garten", "garden", "spielen", "through"):
        assert len(tokenizer.tokenize(word)) <= len(word) / 2, word
    pieces = tokenizer.id_to_piece(tokenizer.tokenize("Garten garden"))
    assert "".join(pieces).replace("▁", " ").strip() == "Garten garden"


def test_trains_on_pairs_too():
    pairs = list(zip(TRAINING_TEXT[1::2], TRAINING_TEXT[::2]))
    from_pairs = SubwordTokenizer.train(pairs, vocabulary_size=320)
    from_texts = SubwordTokenizer.train(TRAINING_TEXT[1::2] + TRAINING_TEXT[::2], vocabulary_size=320)
    assert from_pairs.proto == from_texts.proto


def test_save_and_load(tokenizer, tmp_path):
    tokenizer.save(tmp_path / "vocab")
    loaded = SubwordTokenizer.load(tmp_path / "vocab")
    assert loaded.vocabulary_size == tokenizer.vocabulary_size == 360
    assert loaded.tokenize("Ein Mann fährt.") == tokenizer.tokenize("Ein Mann fährt.")
    assert loaded.fingerprint() == tokenizer.fingerprint()
    with pytest.raises(FileNotFoundError, match="No tokenizer in .*: expected subword.model"):
        SubwordTokenizer.load(tmp_path / "nowhere")
    (tmp_path / "vocab" / "subword.json").write_text('{"vocabulary_size": 999}')
    with pytest.raises(ValueError, match="vocabulary_size=999, but .* has 360 pieces"):
        SubwordTokenizer.load(tmp_path / "vocab")


def test_tokenizes_with_the_ops_the_exported_graph_uses(tokenizer):
    """The SavedModel tokenizes with tensorflow-text's op: same ids, same text."""
    tf = pytest.importorskip("tensorflow", reason="the export's graph tokenizer is TensorFlow's")
    import tensorflow_text

    from keras_transformer.export.graph_tokenizers import detokenize_exactly

    lines = ["Zwei Hunde.", "  Two dogs. ", "naïve café 🙂", ""]
    graph = tensorflow_text.SentencepieceTokenizer(model=tokenizer.proto, out_type=tf.int32)
    assert graph.tokenize(lines).to_list() == tokenizer.tokenize(lines)
    restored = detokenize_exactly(graph, tf.ragged.constant(tokenizer.tokenize(lines), tf.int32))
    assert [text.decode() for text in restored.numpy()] == tokenizer.detokenize(tokenizer.tokenize(lines))


def test_tokenizes_without_tensorflow(tokenizer):
    """A plain NumPy or Python consumer: lists of ints in, strings out."""
    assert tokenizer.detokenize(np.array(tokenizer.tokenize(["Two dogs.", "Two dogs."]))) == ["Two dogs."] * 2
    with pytest.raises(TypeError, match=r"`strings\[1\]` must be a str. Received: bytes"):
        tokenizer.tokenize(["fine", b"bytes"])


def test_too_large_a_vocabulary_or_no_text_is_reported():
    with pytest.raises(ValueError, match="could not train a vocabulary of 100000 bpe tokens on 4 sentences"):
        SubwordTokenizer.train(TRAINING_TEXT[:4], vocabulary_size=100000)
    with pytest.raises(ValueError, match="Received: no text"):
        SubwordTokenizer.train(["", "  "], vocabulary_size=300)
    # SentencePiece's own words were "cannot parse "nan" as int".
    for size in (float("nan"), 300.5, True, 0, 260):
        with pytest.raises(ValueError, match=rf"vocabulary_size must be an integer >= 261 .* Received: vocabulary_size={size!r}"):
            SubwordTokenizer.train(TRAINING_TEXT, vocabulary_size=size)


@pytest.mark.parametrize(
    "texts, message",
    [
        ("a whole text in one string", r"Received a single str of length 26; wrap it in a list"),
        (["a sentence", 5], r"`texts\[1\]` must be a sentence \(str\) or a pair of sentences. Received: int 5"),
        ([("a source", None)], r"`texts\[0\]` must be a sentence .* Received: NoneType None"),
        ([b"bytes"], r"`texts\[0\]` must be a sentence .* Received: bytes b'bytes'"),
    ],
)
def test_texts_of_the_wrong_type_are_reported_not_trained_on(texts, message):
    # A string is an iterable of characters, and trained on them without a word.
    with pytest.raises(TypeError, match=message):
        SubwordTokenizer.train(texts, 300)


@needs_multi30k
def test_multi30k_vocabulary_round_trips_every_line():
    corpus = read_parallel_text(
        os.path.join(MULTI30K, "train.en"), os.path.join(MULTI30K, "train.de")
    )
    tokenizer = SubwordTokenizer.train(corpus, vocabulary_size=8000)
    assert tokenizer.vocabulary_size == 8000
    lines = corpus.texts()
    restored = tokenizer.detokenize(tokenizer.tokenize(lines))
    exact = np.mean([r == line for r, line in zip(restored, lines)])
    assert exact >= 0.999
