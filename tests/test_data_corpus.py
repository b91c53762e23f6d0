import gzip
import logging
import re
import sys
import types

import pytest
import tensorflow as tf

from keras_transformer import environment
from keras_transformer.data import read_parallel_text
from keras_transformer.data import read_tfds


def write(path, text, compress=False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    if compress:
        with gzip.open(path, "wb") as file:
            file.write(data)
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("compress", [False, True])
def test_reads_aligned_pairs_plain_or_gzipped(tmp_path, compress):
    suffix = ".gz" if compress else ""
    source = write(tmp_path / f"train.en{suffix}", "A cat.\nTwo dogs run.\n", compress)
    target = write(tmp_path / f"train.de{suffix}", "Eine Katze.\nZwei Hunde rennen.\n", compress)
    corpus = read_parallel_text(source, target)
    assert list(corpus) == [("A cat.", "Eine Katze."), ("Two dogs run.", "Zwei Hunde rennen.")]
    assert (corpus.skipped_empty, corpus.filtered_too_long) == (0, 0)


def test_windows_line_endings_and_no_final_newline(tmp_path):
    source = write(tmp_path / "a.en", "one\r\ntwo")
    target = write(tmp_path / "a.de", "eins\r\nzwei")
    assert list(read_parallel_text(source, target)) == [("one", "eins"), ("two", "zwei")]


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "train.en", "a\nb\nc\n")
    target = write(tmp_path / "train.de", "a\nb\n")
    with pytest.raises(ValueError) as error:
        read_parallel_text(source, target)
    message = str(error.value)
    assert f"{source} has 3 lines" in message and f"{target} has 2 lines" in message


def test_invalid_utf8_names_the_file_and_line(tmp_path):
    source = write(tmp_path / "train.en", "fine\nalso fine\n")
    target = write(tmp_path / "train.de", b"gut\nM\xfcnchen ist sch\xf6n\n")  # Latin-1
    with pytest.raises(ValueError, match=rf"{target}:2: invalid UTF-8 at byte 1"):
        read_parallel_text(source, target)


def test_empty_lines_are_skipped_and_counted(tmp_path, caplog):
    source = write(tmp_path / "train.en", "one\n\nthree\n   \nfive\n")
    target = write(tmp_path / "train.de", "eins\nzwei\n\nvier\nfünf\n")
    with caplog.at_level(logging.WARNING, logger="keras_transformer"):
        corpus = read_parallel_text(source, target)
    # Pairs stay aligned: no side shifts onto another's line.
    assert list(corpus) == [("one", "eins"), ("five", "fünf")]
    assert corpus.skipped_empty == 3
    assert "skipped 3 with an empty side" in caplog.text


def test_long_sentences_are_filtered_and_counted(tmp_path):
    source = write(tmp_path / "train.en", "short one\n" + "word " * 9 + "\nok\n")
    target = write(tmp_path / "train.de", "kurz\nlang\n" + "wort " * 9 + "\n")
    corpus = read_parallel_text(source, target, max_length=5)
    assert list(corpus) == [("short one", "kurz")]
    assert corpus.filtered_too_long == 2
    assert "filtered 2 longer than the maximum length" in corpus.summary()
    with pytest.raises(ValueError, match="max_length=0"):
        read_parallel_text(source, target, max_length=0)


def test_missing_or_broken_files_are_reported(tmp_path):
    target = write(tmp_path / "train.de", "a\n")
    with pytest.raises(ValueError, match="Cannot read .*missing.en"):
        read_parallel_text(tmp_path / "missing.en", target)
    broken = write(tmp_path / "broken.en.gz", b"not gzip at all")
    with pytest.raises(ValueError, match="Cannot read .*broken.en.gz"):
        read_parallel_text(broken, target)


def test_slicing_keeps_a_corpus(tmp_path):
    source = write(tmp_path / "a.en", "1\n2\n3\n")
    target = write(tmp_path / "a.de", "eins\nzwei\ndrei\n")
    corpus = read_parallel_text(source, target)
    assert list(corpus[1:]) == [("2", "zwei"), ("3", "drei")]
    assert corpus.texts() == ["1", "2", "3", "eins", "zwei", "drei"]


def test_tfds_reader_explains_the_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # not installed
    with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
        read_tfds()


def test_tfds_reader_decodes_and_filters_examples(monkeypatch):
    """A stand-in for `tfds.load` serving the dataset's real feature layout."""
    examples = {
        "en": ["A cat.", "", "one two three four five six", "Two dogs."],
        "de": ["Eine Katze.", "Leer.", "eins", "Zwei Hunde."],
    }
    calls = []

    def load(name, split, data_dir):
        calls.append((name, split, data_dir))
        return tf.data.Dataset.from_tensor_slices(examples)

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", types.SimpleNamespace(load=load))
    # TensorFlow's GPUs are hidden from it before TFDS starts it (beside JAX or torch).
    monkeypatch.setattr(environment, "tensorflow_beside_backend", lambda: calls.append("GPUs hidden"))
    corpus = read_tfds(split="validation", max_length=5, data_dir="/data/tfds")
    assert calls == ["GPUs hidden", ("wmt14_translate/de-en", "validation", "/data/tfds")]
    assert list(corpus) == [("A cat.", "Eine Katze."), ("Two dogs.", "Zwei Hunde.")]
    assert (corpus.skipped_empty, corpus.filtered_too_long) == (1, 1)
    assert corpus.name == "tfds:wmt14_translate/de-en/validation"


def test_a_gzip_file_with_damaged_bytes_is_an_error_naming_it(tmp_path):
    """A damaged deflate stream raises zlib.error, which was not caught."""
    text = "".join(f"line {i} of a parallel corpus with some words\n" for i in range(2000)).encode()
    damaged = bytearray(gzip.compress(text))
    damaged[200:260] = bytes(b ^ 0x5A for b in damaged[200:260])
    path = tmp_path / "train.de.gz"
    path.write_bytes(bytes(damaged))
    (tmp_path / "train.en").write_bytes(text)
    with pytest.raises(ValueError, match=rf"Cannot read {re.escape(str(path))}: Error -3 while decompressing"):
        read_parallel_text(tmp_path / "train.en", path)
