"""Scores of given translations (`Translator.score`): the log-probability a
search reports for the translation it found is the one `score` gives it."""

import re
import types

import numpy as np
import pytest
from conftest import in_one_pass
from translation_fixtures import SENTENCES
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)

from keras_transformer import cli
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


def assert_search_scores_are_scores(model, tokenizer, beam_size, **search):  # noqa: F811
    """Each hypothesis of the search (with `search`'s settings) is scored
    by `score` as the search scored it, in one batch of hypotheses of
    several lengths."""
    translator = Translator(model, tokenizer, beam_size=beam_size, batch_size=32, max_extra_length=6, **search)
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


@in_one_pass("torch", "the searches and score are the same code on every backend; each backend's score is checked "
                      "against transformers' in test_convert_*.py, and its searches against generate's")
def test_beam_search_s_score_is_the_score_of_its_translation_over_the_length_penalty(model, tokenizer):  # noqa: F811
    assert_search_scores_are_scores(model, tokenizer, beam_size=3)


@in_one_pass("torch", "as the test above")
def test_greedy_search_s_score_is_the_log_probability_of_its_translation(model, tokenizer):  # noqa: F811
    assert_search_scores_are_scores(model, tokenizer, beam_size=1)


@in_one_pass("torch", "as the test above")
def test_a_sample_s_score_is_the_log_probability_of_its_translation(model, tokenizer):  # noqa: F811
    assert_search_scores_are_scores(model, tokenizer, beam_size=1, sampling="topp:0.9", temperature=1.5)


def test_a_pair_scores_the_same_alone_and_among_others(model, tokenizer):  # noqa: F811
    translator = Translator(model, tokenizer, batch_size=8)
    sources = [s for s in SENTENCES if s.strip()]
    targets = ["der alte Mann", "eine Frau hilft dem kleinen Kind .", "weil", "die Katze .", "heute", "der Mann"]
    together = translator.score(sources, targets)
    for source, target, score in list(zip(sources, targets, together))[1:3]:  # the longest target, the shortest
        (alone,) = translator.score([source], [target], token_scores=True)
        np.testing.assert_allclose(alone.log_probability, score.log_probability, atol=1e-4, rtol=1e-5)
        assert alone.tokens == score.tokens == len(tokenizer.tokenize([target])[0]) + 1
        assert alone.mean == pytest.approx(alone.log_probability / alone.tokens)
        assert score.token_log_probabilities is None


def test_bad_pairs_are_refused_naming_the_line(model, tokenizer):  # noqa: F811
    translator = Translator(model, tokenizer, max_source_length=8, max_extra_length=4)
    with pytest.raises(ValueError, match=r"one target per source. Received 2 sources and 1 targets"):
        translator.score(["a", "b"], ["x"])
    with pytest.raises(ValueError, match=r"Line 12 has a blank target.*Received: 'the cat .' -> '  '"):
        translator.score(["the dog .", "the cat ."], ["der Hund .", "  "], first_line=10)
    long = "the old man sees the dog and the woman sees the cat ."
    with pytest.raises(ValueError, match=r"Line 1 has a source of \d+ subword tokens .* max_source_length=8"):
        translator.score([long], ["x"])
    with pytest.raises(ValueError, match=r"has a target of \d+ tokens .* Expected at most 12"):
        translator.score(["the dog ."], [long])
    with pytest.raises(TypeError, match="list of strings"):
        translator.score("the dog .", ["x"])
    assert translator.score([], []) == []


@pytest.fixture(scope="module")
def model_dir(translation_model, translation_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("translator")
    Translator(translation_model, translation_tokenizer, batch_size=2, max_extra_length=6).save(directory)
    return directory


PAIRS = [
    ("the old man sees the dog .", "der alte Mann sieht den Hund ."),
    ("a woman helps the small child .", "eine Frau hilft dem kleinen Kind ."),
    ("the cat .", "die Katze ."),
    ("because the dog sleeps , the man reads a book .", "weil der Hund schläft , liest der Mann ein Buch ."),
    ("today the young woman visits the old man .", "heute besucht die junge Frau den alten Mann ."),
]


def write_pairs(directory, pairs=PAIRS):
    for side, suffix in ((0, "en"), (1, "de")):
        (directory / f"pairs.{suffix}").write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    return str(directory / "pairs.en"), str(directory / "pairs.de")


@in_one_pass("torch", "the command's plumbing; each backend's scores are tested above")
def test_the_score_command_writes_a_line_of_scores_per_pair_and_continues_an_interrupted_output(model_dir, tmp_path,
                                                                                                capsys):
    from keras_transformer.decoding import streaming

    source, target = write_pairs(tmp_path)
    output = tmp_path / "scores.tsv"
    command = ["score", "--model-dir", str(model_dir), "--source", source, "--target", target, "--token-scores",
               "--window", "2"]
    cli.main(command + ["--output", str(output)])
    translator = Translator.load(model_dir)
    expected = translator.score([s for s, _ in PAIRS], [t for _, t in PAIRS], token_scores=True)
    lines = output.read_text().splitlines()
    assert len(lines) == len(PAIRS)
    for line, score in zip(lines, expected):
        total, mean, tokens = line.split("\t")
        # Other batches than the command's windows: rounding apart.
        assert float(total) == pytest.approx(score.log_probability, abs=1e-4)
        assert float(mean) == pytest.approx(score.mean, abs=1e-4)
        np.testing.assert_allclose([float(v) for v in tokens.split()], score.token_log_probabilities, atol=1e-4)

    class Interrupted(scoring.ScoredLines):  # a run killed after its first window
        def translate(self, texts, first_line=0):
            if first_line:
                raise KeyboardInterrupt
            return super().translate(texts, first_line)

    # What the command continues an output with: the same translator, model and scores.
    settings = cli._continued_with(translator, types.SimpleNamespace(model_dir=str(model_dir))) | {"scores": "tokens"}
    resumed = tmp_path / "resumed.tsv"
    with pytest.raises(KeyboardInterrupt):
        streaming.translate_file(Interrupted(translator, True), streaming.PairedLines(source, target), str(resumed),
                                 window=2, settings=settings)
    assert len((tmp_path / "resumed.tsv.partial").read_text().splitlines()) == 2
    capsys.readouterr()
    cli.main(command + ["--output", str(resumed), "--progress"])
    err = capsys.readouterr().err
    assert "2 lines kept from an interrupted run" in err
    assert re.search(r"^scored 5 of 5 pairs \(100\.0%\), [\d.,]+ pairs/s", err, re.MULTILINE), err
    assert resumed.read_text() == output.read_text()
    # Without token scores: the sums and means alone.
    cli.main(command[:-3] + ["--output", str(tmp_path / "sums.tsv")])  # one window: other batches
    sums = [line.split("\t") for line in (tmp_path / "sums.tsv").read_text().splitlines()]
    assert {len(fields) for fields in sums} == {2}
    np.testing.assert_allclose([float(f[0]) for f in sums], [s.log_probability for s in expected], atol=1e-4)


@in_one_pass("torch", "the command's error lines")
def test_the_score_command_reports_bad_pairs_in_one_line(model_dir, tmp_path):
    source, target = write_pairs(tmp_path, PAIRS[:3])
    (tmp_path / "short.de").write_text("eins\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"^error: .*short.de ends before .*pairs.en: it has 1 lines"):
        cli.main(["score", "--model-dir", str(model_dir), "--source", source, "--target", str(tmp_path / "short.de")])
    (tmp_path / "blank.de").write_text("eins\n\ndrei\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"^error: Line 2 has a blank target"):
        cli.main(["score", "--model-dir", str(model_dir), "--source", source, "--target", str(tmp_path / "blank.de")])
    with pytest.raises(SystemExit, match=r"^error: Pairs are read from two files"):
        cli.main(["score", "--model-dir", str(model_dir), "--source", "-", "--target", target])
