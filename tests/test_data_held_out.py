import numpy as np
import pytest

from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import builtin_corpus
from keras_transformer.data import prepare_dataset
from keras_transformer.data.held_out import SOURCE_FILE
from keras_transformer.data.held_out import TARGET_FILE
from keras_transformer.data.held_out import is_held_out
from keras_transformer.data.prepared import tokenize_pairs


def test_the_same_pairs_are_held_out_for_a_seed_and_about_the_fraction():
    indices = np.arange(200_000)
    held = is_held_out(indices, 0.1, seed=0)
    assert abs(held.mean() - 0.1) < 0.005
    np.testing.assert_array_equal(held[1000:2000], is_held_out(indices[1000:2000], 0.1, seed=0))
    assert (held != is_held_out(indices, 0.1, seed=1)).any()
    assert not (is_held_out(indices, 0.05, seed=0) & ~held).any()  # a smaller fraction, a subset
    assert not is_held_out(indices, 1e-9, seed=0).any()  # no index, not even 0, is held out by every fraction


def test_prepare_holds_out_the_same_pairs_whatever_the_chunks(tmp_path):
    corpus = builtin_corpus("train", size=300, seed=3)
    tokenizer = SubwordTokenizer.train(corpus, vocabulary_size=400)
    sources, targets = zip(*corpus)
    # Two files in turn: pair indices go on counting across them.
    for name, lines in (("a.en", sources[:120]), ("a.de", targets[:120]), ("b.en", sources[120:]), ("b.de", targets[120:])):
        (tmp_path / name).write_text("".join(line + "\n" for line in lines))
    files = [str(tmp_path / "a.en"), str(tmp_path / "b.en")], [str(tmp_path / "a.de"), str(tmp_path / "b.de")]
    held = is_held_out(np.arange(300), 0.2, seed=0)
    for chunk in (7, 1000):
        prepared = prepare_dataset(*files, tokenizer, tmp_path / f"p{chunk}", chunk_pairs=chunk, held_out=0.2)
        assert (tmp_path / f"p{chunk}" / SOURCE_FILE).read_text().splitlines() == [s for s, h in zip(sources, held) if h]
        assert (tmp_path / f"p{chunk}" / TARGET_FILE).read_text().splitlines() == [t for t, h in zip(targets, held) if h]
        expected = tokenize_pairs([s for s, h in zip(sources, held) if not h], [t for t, h in zip(targets, held) if not h], tokenizer)
        np.testing.assert_array_equal(np.asarray(prepared.target_ids), expected.target_ids)
        assert prepared.manifest["held_out"]["pairs"] == held.sum() and prepared.manifest["pairs"] == 300 - held.sum()
    for fraction in (0, 1, float("nan"), -0.5, True):
        with pytest.raises(ValueError, match=rf"between 0 and 1 \(both excluded\). Received: {fraction!r}"):
            prepare_dataset(*files, tokenizer, tmp_path / "bad", held_out=fraction)
