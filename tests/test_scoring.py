"""Scores of given translations (`Translator.score`): the log-probability a
search reports for the translation it found is the one `score` gives it."""

import numpy as np
import pytest
from translation_fixtures import SENTENCES
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)

from keras_transformer.decoding import Translator
from keras_transformer.decoding import scoring
from keras_transformer.decoding.beam_search import length_penalty


def found_pairs(translator):
    """The search's `(source_ids, output ids to EOS)` and score of each
    sentence, by index."""
    eos = translator.tokenizer.eos_id
    pairs, scores = {}, {}
    for i, (source_ids, ids, found) in translator.search(SENTENCES).items():
        for rank, row in enumerate(ids.tolist()):
            # An output cut at its limit has no EOS (and beam search scores it by that limit's penalty).
            pairs[(i, rank)] = (list(source_ids), row[: row.index(eos) + 1] if eos in row else [t for t in row if t])
            scores[(i, rank)] = float(found[rank])
    return pairs, scores


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_search_s_score_is_the_score_of_its_translation(model, tokenizer, beam_size):  # noqa: F811
    """Greedy search's score is log P of its output; beam search's, log P
    over the length penalty: each equals `score`'s, in batches of their own
    sorting and padding."""
    translator = Translator(model, tokenizer, beam_size=beam_size, batch_size=4, max_extra_length=6)
    pairs, found = found_pairs(translator)
    scored = scoring.score_ids(translator, dict(enumerate(pairs.values())), 0, token_scores=True)
    assert len(scored) == len(pairs) == beam_size * sum(1 for s in SENTENCES if s.strip())
    lengths = {len(target) for _, target in pairs.values()}
    assert len(lengths) > 2  # outputs of several lengths, so that padding is exercised
    for k, (key, (_, target)) in enumerate(pairs.items()):
        score = scored[k]
        assert score.tokens == len(target) == len(score.token_log_probabilities)
        np.testing.assert_allclose(sum(score.token_log_probabilities), score.log_probability, rtol=1e-5)
        assert all(value <= 0 for value in score.token_log_probabilities)
        penalty = 1.0 if beam_size == 1 else float(length_penalty(len(target), translator.alpha))
        np.testing.assert_allclose(score.log_probability / penalty, found[key], atol=1e-4, rtol=1e-5)


def test_a_pair_scores_the_same_alone_and_among_others(model, tokenizer):  # noqa: F811
    translator = Translator(model, tokenizer, batch_size=4)
    sources = [s for s in SENTENCES if s.strip()]
    targets = ["der alte Mann", "eine Frau hilft dem kleinen Kind .", "weil", "die Katze .", "heute", "der Mann"]
    together = translator.score(sources, targets)
    for source, target, score in zip(sources, targets, together):
        (alone,) = translator.score([source], [target], token_scores=True)
        np.testing.assert_allclose(alone.log_probability, score.log_probability, atol=1e-4, rtol=1e-5)
        assert alone.tokens == score.tokens == len(tokenizer.tokenize([target])[0]) + 1
        assert alone.mean == pytest.approx(alone.log_probability / alone.tokens)
        assert score.token_log_probabilities is None


def test_bad_pairs_are_refused_naming_the_line(model, tokenizer):  # noqa: F811
    translator = Translator(model, tokenizer, max_source_length=8, max_extra_length=4)
    with pytest.raises(ValueError, match=r"one target per source. Received 2 sources and 1 targets"):
        translator.score(["a", "b"], ["x"])
    with pytest.raises(ValueError, match=r"Line 12 \(pair 1\) has a blank target.*Received: 'the cat .' -> '  '"):
        translator.score(["the dog .", "the cat ."], ["der Hund .", "  "], first_line=10)
    long = "the old man sees the dog and the woman sees the cat ."
    with pytest.raises(ValueError, match=r"Line 1 \(pair 0\) has a source of \d+ subword tokens .* max_source_length=8"):
        translator.score([long], ["x"])
    with pytest.raises(ValueError, match=r"has a target of \d+ tokens .* Expected at most 12"):
        translator.score(["the dog ."], [long])
    with pytest.raises(TypeError, match="list of strings"):
        translator.score("the dog .", ["x"])
    assert translator.score([], []) == []
