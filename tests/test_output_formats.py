"""n-best lists with scores, as text, TSV or JSON lines
(keras_transformer/decoding/output_formats.py), and their files continued
after an interruption."""

import json

import pytest
from conftest import in_one_pass
from translation_fixtures import SENTENCES

from keras_transformer import cli
from keras_transformer.decoding import Translator
from keras_transformer.decoding import translate_file
from keras_transformer.decoding.output_formats import FormattedLines

pytestmark = in_one_pass("jax", "host code around the searches, which test_translator.py runs on every backend")

LINES = [sentence for sentence in SENTENCES if sentence.strip()][:5] + ["", SENTENCES[-1]]


@pytest.fixture(scope="module")
def translator(translation_model, translation_tokenizer):
    return Translator(translation_model, translation_tokenizer, beam_size=3, max_extra_length=6, batch_size=4)


def test_n_best_gives_the_first_hypotheses_or_as_many_samples_best_first(translator):
    every = translator.n_best(LINES)
    assert translator.n_best(LINES, count=2) == [hypotheses[:2] for hypotheses in every]
    with pytest.raises(ValueError, match=r"n_best must be an integer from 1 to the beam size, 3 .* Received: n_best=4"):
        translator.n_best(LINES, count=4)
    sampling = translator.with_search(sampling="topp:0.9", temperature=1.5)
    drawn = sampling.n_best(LINES, count=5)
    assert [len(samples) for samples in drawn] == [5] * 5 + [1, 5] and drawn[5] == [("", 0.0)]
    assert all([score for _, score in samples] == sorted((score for _, score in samples), reverse=True) for samples in drawn)
    assert len({text for text, _ in drawn[0]}) > 1  # the samples differ (test_scoring.py checks their scores)


def test_each_format_writes_a_record_per_line(translator):
    hypotheses = translator.n_best(LINES, count=2)
    text = FormattedLines(translator, 2).translate(LINES)
    assert text[0] == "\n".join(t for t, _ in hypotheses[0]) and text[5] == "\n"
    scored = FormattedLines(translator, 2, with_scores=True).translate(LINES)
    assert scored[1] == "\n".join(f"{s:.6f}\t{t}" for t, s in hypotheses[1])
    tsv = FormattedLines(translator, 2, "tsv").translate(LINES, first_line=10)
    assert tsv[2].split("\n")[1] == f"13\t2\t{hypotheses[2][1][1]:.6f}\t{hypotheses[2][1][0]}"
    records = [json.loads(line) for line in FormattedLines(translator, 2, "jsonl").translate(LINES)]
    assert records[3] == {
        "line": 4, "translation": hypotheses[3][0][0], "score": round(hypotheses[3][0][1], 6),
        "alternatives": [{"translation": hypotheses[3][1][0], "score": round(hypotheses[3][1][1], 6)}],
    }
    with pytest.raises(ValueError, match=r"output_format must be one of \['text', 'tsv', 'jsonl'\]. Received: output_format='csv'"):
        FormattedLines(translator, 2, "csv")


class Interrupted:
    """Formatted lines that stop after `windows` windows, as a kill would."""

    def __init__(self, lines, windows):
        self.lines, self.windows, self.lines_per_record = lines, windows, lines.lines_per_record
        self.get_config = lines.get_config

    def translate(self, texts, first_line=0):
        if not self.windows:
            raise KeyboardInterrupt
        self.windows -= 1
        return self.lines.translate(texts, first_line)


def test_an_interrupted_n_best_file_continues_after_its_last_whole_record(translator, tmp_path):
    source = tmp_path / "in.en"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    tsv = FormattedLines(translator, 2, "tsv")
    translate_file(tsv, source, tmp_path / "whole.tsv", window=2)
    whole = (tmp_path / "whole.tsv").read_text(encoding="utf-8").splitlines()
    assert len(whole) == 2 * len(LINES)
    output = tmp_path / "out.tsv"
    with pytest.raises(KeyboardInterrupt):
        translate_file(Interrupted(tsv, 2), source, output, window=2)
    # A kill inside the next window's write: a whole record and one line of the next.
    with open(f"{output}.partial", "a", encoding="utf-8") as file:
        file.write("\n".join(whole[8:11]) + "\n")
    logged = []
    translate_file(tsv, source, output, window=2, log=logged.append)
    assert output.read_text(encoding="utf-8").splitlines() == whole
    assert logged == [f"continuing {output}.partial: 5 lines kept from an interrupted run, translating from line 6"]


def test_the_command_writes_n_best_lists_and_refuses_what_cannot_be(translator, tmp_path):
    translator.save(tmp_path / "model")
    source = tmp_path / "in.en"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    arguments = ["translate", "--model-dir", str(tmp_path / "model"), "--input", str(source)]
    cli.main(arguments + ["--output", str(tmp_path / "out.jsonl"), "--n-best", "3", "--output-format", "jsonl"])
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    expected = translator.n_best(LINES)
    assert [[r["translation"]] + [a["translation"] for a in r["alternatives"]] for r in records] == [
        [t for t, _ in hypotheses] + [""] * (3 - len(hypotheses)) for hypotheses in expected]
    for bad, message in (
        (["--n-best", "4"], r"^error: n_best must be an integer from 1 to the beam size, 3"),
        (["--n-best", "2", "--split-sentences"], r"^error: --split-sentences writes one translation per line"),
        (["--with-scores", "--output-format", "tsv"], r"^error: --with-scores adds scores to text output; tsv always has them"),
    ):
        with pytest.raises(SystemExit, match=message):
            cli.main(arguments + bad)
