import gzip
import json
import os
import re

import numpy as np
import pytest

from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import TokenBatches
from keras_transformer.data import builtin_corpus
from keras_transformer.data import load_prepared
from keras_transformer.data import make_dataset
from keras_transformer.data import prepare_dataset
from keras_transformer.data import prepared
from keras_transformer.data.prepared import sample_pairs
from keras_transformer.data.prepared import read_pairs


@pytest.fixture(scope="module")
def corpus():
    return builtin_corpus("train", size=600, seed=2)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return SubwordTokenizer.train(corpus, vocabulary_size=500)


def write(path, lines, compress=False):
    text = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return str(path)


def test_prepared_pairs_are_the_tokenized_text_across_files_and_chunks(corpus, tokenizer, tmp_path):
    sources, targets = list(corpus.sources), list(corpus.targets)
    # A pair with a blank side is left out and counted, as read_parallel_text does.
    first = (write(tmp_path / "a.en", sources[:250] + [" "]), write(tmp_path / "a.de", targets[:250] + ["Hallo."]))
    second = (
        write(tmp_path / "b.en.gz", sources[250:], compress=True),
        write(tmp_path / "b.de.gz", targets[250:], compress=True),
    )
    pairs = prepare_dataset(
        [first[0], second[0]], [first[1], second[1]], tokenizer, tmp_path / "prepared", chunk_pairs=64
    )
    manifest = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
    assert manifest["pairs"] == len(pairs) == len(corpus)
    assert manifest["left_out"] == {"empty_side": 1, "too_long": 0}
    assert [entry["lines"] for entry in manifest["files"]] == [251, 350]
    assert manifest["vocabulary_fingerprint"] == tokenizer.fingerprint()
    assert pairs.source_ids.dtype == np.uint16 and not pairs.source_ids.flags.writeable
    for index in (0, 249, 250, 599):
        for side, texts in (("source", sources), ("target", targets)):
            offsets = getattr(pairs, f"{side}_offsets")
            ids = getattr(pairs, f"{side}_ids")[offsets[index] : offsets[index + 1]]
            assert ids.tolist() == tokenizer.tokenize(texts[index])
            assert getattr(pairs, f"{side}_lengths")[index] == len(ids)
    # Batches of the prepared set are those of the same corpus in memory.
    mapped = TokenBatches(load_prepared(tmp_path / "prepared", tokenizer), 512, seed=4)
    in_memory = make_dataset(corpus, tokenizer, 512, seed=4)
    assert len(mapped) == len(in_memory)
    for (x, y), (x2, y2) in zip(mapped, in_memory):
        np.testing.assert_array_equal(x["source_ids"], x2["source_ids"])
        np.testing.assert_array_equal(x["target_ids"], x2["target_ids"])
        np.testing.assert_array_equal(y, y2)


def test_a_prepared_set_belongs_to_its_vocabulary_and_must_be_whole(corpus, tokenizer, tmp_path):
    source, target = write(tmp_path / "x.en", corpus.sources[:40]), write(tmp_path / "x.de", corpus.targets[:40])
    directory = tmp_path / "prepared"
    prepare_dataset(source, target, tokenizer, directory)
    other = SubwordTokenizer.train(corpus[:300], vocabulary_size=400)
    with pytest.raises(ValueError, match=r"prepared with another vocabulary .* Prepare it again"):
        load_prepared(directory, other)
    ids = directory / "target.ids"
    ids.write_bytes(ids.read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"target.ids holds \d+ bytes; the manifest expects \d+"):
        load_prepared(directory)
    # A preparation cut short has no manifest, and is not taken for a whole one.
    (directory / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"No prepared dataset in .*: expected manifest.json"):
        load_prepared(directory)


def test_bad_files_are_errors_naming_them(corpus, tokenizer, tmp_path):
    source = write(tmp_path / "x.en", corpus.sources[:10])
    short = write(tmp_path / "short.de", corpus.targets[:9])
    with pytest.raises(ValueError, match=r"short.de ends after 9 lines and the other goes on"):
        prepare_dataset(source, short, tokenizer, tmp_path / "p1")
    broken = tmp_path / "broken.de"
    broken.write_bytes(b"".join(line.encode() + b"\n" for line in corpus.targets[:4]) + b"\xff\xfe\n" * 6)
    with pytest.raises(ValueError, match=r"broken.de:5: invalid UTF-8"):
        prepare_dataset(source, str(broken), tokenizer, tmp_path / "p2")
    damaged = bytearray(gzip.compress("\n".join(corpus.targets[:10]).encode() * 50))
    damaged[len(damaged) // 2 : len(damaged) // 2 + 16] = b"\x00" * 16
    (tmp_path / "damaged.de.gz").write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match=r"Cannot read .*damaged.de.gz"):
        prepare_dataset(source, str(tmp_path / "damaged.de.gz"), tokenizer, tmp_path / "p3")
    assert not os.path.exists(tmp_path / "p3" / "manifest.json")


def test_the_vocabulary_sample_is_uniform_and_whole_when_small(corpus, tmp_path):
    source, target = write(tmp_path / "x.en", corpus.sources), write(tmp_path / "x.de", corpus.targets)
    everything = sample_pairs(read_pairs([source], [target], chunk_pairs=50), 10_000)
    assert everything == list(corpus)
    sample = sample_pairs(read_pairs([source], [target], chunk_pairs=50), 100, seed=1)
    assert len(sample) == 100 and set(sample) <= set(corpus)
    # Drawn from the whole stream, not its head.
    assert max(list(corpus).index(pair) for pair in sample) > 400


def mapped_kilobytes(directory):
    """Resident kilobytes of this process's mappings of `directory`'s files."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):  # a mapping, then its sizes
                inside = len(fields) >= 6 and fields[-1].startswith(str(directory))
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_a_large_set_is_read_without_mapping_it_whole(corpus, tokenizer, tmp_path, monkeypatch):
    """Random batches read through a mapping soon count the whole set as
    resident (the kernel maps the pages around each one touched); a set
    over MAPPED_WHOLE_BYTES is read with a call a sentence instead."""
    source, target = write(tmp_path / "x.en", corpus.sources * 20), write(tmp_path / "x.de", corpus.targets * 20)
    pairs = prepare_dataset(source, target, tokenizer, tmp_path / "prepared")
    mapped = [TokenBatches(pairs, 1024, repeat=True, seed=0)[step] for step in range(20)]
    assert mapped_kilobytes(tmp_path / "prepared") > 100  # a small set may stay mapped
    monkeypatch.setattr(prepared, "MAPPED_WHOLE_BYTES", 0)  # as if it were a large one
    batches = TokenBatches(pairs, 1024, repeat=True, seed=0)
    for step, (inputs, labels) in enumerate(mapped):
        again = batches[step]
        np.testing.assert_array_equal(again[0]["source_ids"], inputs["source_ids"])
        np.testing.assert_array_equal(again[0]["target_ids"], inputs["target_ids"])
        np.testing.assert_array_equal(again[1], labels)
    assert mapped_kilobytes(tmp_path / "prepared") == 0


def test_a_set_that_fits_in_memory_is_read_ahead_in_file_order(corpus, tokenizer, tmp_path, monkeypatch):
    """Random batches from a cold disk wait for a seek a sentence; reading the
    ids through once, in order, puts them in the page cache first."""
    with monkeypatch.context() as patch:
        patch.setattr(prepared, "_available_memory", lambda: 0)  # no reading ahead while loading
        source, target = write(tmp_path / "x.en", corpus.sources), write(tmp_path / "x.de", corpus.targets)
        pairs = prepare_dataset(source, target, tokenizer, tmp_path / "prepared")
    reads, preadv = [], os.preadv

    def recorded(fd, buffers, offset):
        reads.append((os.readlink(f"/proc/self/fd/{fd}"), offset))
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", recorded)
    pairs.read_ahead(chunk=64).join()
    for side in ("source", "target"):
        path = os.path.realpath(tmp_path / "prepared" / f"{side}.ids")
        expected = list(range(0, os.path.getsize(path), 64))
        assert [offset for name, offset in reads if name == path] == expected and expected
    assert {os.path.basename(name) for name, _ in reads} == {"source.ids", "target.ids"}
    monkeypatch.setattr(prepared, "_available_memory", lambda: 2 * (len(pairs.source_ids) + len(pairs.target_ids)))
    assert pairs.read_ahead() is None  # more than half of what is free: left to the disk


def test_a_large_set_whose_lengths_disagree_with_its_offsets_is_an_error(corpus, tokenizer, tmp_path, monkeypatch):
    """A large set finds a sentence from its lengths: lengths that no longer
    add up to the offsets (a damaged file of the right size) are an error,
    not wrong batches."""
    directory = tmp_path / "prepared"
    prepare_dataset(write(tmp_path / "x.en", corpus.sources), write(tmp_path / "x.de", corpus.targets), tokenizer, directory)
    lengths = np.fromfile(directory / "target.lengths", np.uint16)
    lengths[7] += 1
    lengths.tofile(directory / "target.lengths")
    monkeypatch.setattr(prepared, "MAPPED_WHOLE_BYTES", 0)
    pairs = load_prepared(directory)
    np.testing.assert_array_equal(pairs.gather("source", np.array([3, 70]))[1], pairs.source_lengths[[3, 70]])
    with pytest.raises(ValueError, match=r"target lengths add up to \d+ ids; the offsets say \d+.*damaged"):
        pairs.gather("target", np.array([3]))
