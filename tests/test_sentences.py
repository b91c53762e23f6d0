"""Sentence splitting (keras_transformer/data/sentences.py) and
`Translator.translate(..., split_sentences=True)` and `translate
--split-sentences`, which use it."""

import sys

import numpy as np
import pytest
from conftest import in_one_pass
from translation_fixtures import SENTENCES

from keras_transformer import cli
from keras_transformer.data.sentences import joined
from keras_transformer.data.sentences import pieces
from keras_transformer.data.sentences import sources_in_pieces
from keras_transformer.data.sentences import split_text
from keras_transformer.decoding import Translator

TEXTS = [
    "Dr. Smith paid $3.50 for it. Then he left!  Why?\r\n\nA new paragraph.\n",
    "  Herr Dr. Müller kam am 3. Mai. Er blieb.\t",
    "no punctuation at all",
    "",
    " \n \n",
]


@pytest.mark.parametrize("text", TEXTS)
@in_one_pass("torch", "host code around Translator.search_ids, which every pass tests")
def test_a_layout_gives_back_its_text_and_holds_only_stripped_sentences(text):
    layout = split_text(text, "de" if "Herr" in text else "en")
    assert layout.join(layout.sentences) == text
    assert all(sentence == sentence.strip() and sentence for sentence in layout.sentences)
    by_line = split_text(text, sentences=False)
    assert by_line.sentences == [line.strip() for line in text.split("\n") if line.strip()]
    assert by_line.join(by_line.sentences) == text


@in_one_pass("torch", "host code around Translator.search_ids, which every pass tests")
def test_sentences_are_found_by_the_language_s_rules_and_translations_take_their_place():
    layout = split_text(TEXTS[0], "en")
    assert layout.sentences == ["Dr. Smith paid $3.50 for it.", "Then he left!", "Why?", "A new paragraph."]
    assert layout.join(["1", "2", "3", "4"]) == "1 2  3\r\n\n4\n"
    assert split_text(TEXTS[1], "de").sentences == ["Herr Dr. Müller kam am 3. Mai.", "Er blieb."]
    with pytest.raises(ValueError, match="4 sentences need as many translations; received 3"):
        layout.join(["1", "2", "3"])


@in_one_pass("torch", "host code around Translator.search_ids, which every pass tests")
def test_a_missing_splitter_is_named_with_its_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencex", None)
    with pytest.raises(ImportError, match=r'needs sentencex: pip install "keras-vaswani\[serve\]"'):
        split_text("A. B.")
    assert split_text("A. B.", sentences=False).sentences == ["A. B."]  # lines need no splitter


@in_one_pass("torch", "host code around Translator.search_ids, which every pass tests")
def test_long_sentences_are_decoded_in_pieces_and_joined():
    assert pieces(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert pieces([], 3) == [[]]
    sources, owners, split = sources_in_pieces([[5, 6], list(range(10, 17))], 3, eos_id=2)
    assert sources == [[5, 6, 2], [10, 11, 12, 2], [13, 14, 15, 2], [16, 2]]
    assert owners == [0, 1, 1, 1] and split == [(1, 7, 3)]
    assert joined(["a", "b", "c", "d"], owners, 2) == ["a", "b c d"]


@in_one_pass("torch", "host code around Translator.search_ids, which every pass tests")
def test_translate_with_split_sentences_translates_each_sentence_in_its_place(translation_model, translation_tokenizer):
    translator = Translator(translation_model, translation_tokenizer, beam_size=2, max_extra_length=6, languages=("en", "de"))
    one, two, three = SENTENCES[:3]
    expected = translator.translate([one, two, three])
    text = f"{one} {two}\n\n  {three}"
    assert translator.translate([text, ""], split_sentences=True) == [f"{expected[0]} {expected[1]}\n\n  {expected[2]}", ""]
    translator = Translator(translation_model, translation_tokenizer, beam_size=2, max_extra_length=6,
                            max_source_length=16, languages=("en", "de"))
    long_sentence = " and ".join(s.rstrip(" .") for s in SENTENCES * 2) + " ."
    ids = translator.tokenizer.tokenize([long_sentence])[0]
    assert len(ids) > 15
    with pytest.warns(UserWarning, match=rf"Line 4 \(texts\[1\]\) has a sentence of {len(ids)} subword tokens.*in {-(-len(ids) // 15)} pieces"):
        (_, got) = translator.translate(["the cat .", long_sentence], first_line=2, split_sentences=True)
    found = translator.search_ids([piece + [translator.tokenizer.eos_id] for piece in pieces(ids, 15)])
    assert got == " ".join(translator.detokenize([np.asarray(hypotheses)[0].tolist() for hypotheses, _ in found]))


@in_one_pass("torch", "host code around Translator.search_ids, which every pass tests")
def test_the_translate_command_splits_sentences_when_asked(translation_model, translation_tokenizer, tmp_path,
                                                           monkeypatch):
    directory = tmp_path / "translator"
    translator = Translator(translation_model, translation_tokenizer, beam_size=2, max_extra_length=6, languages=("en", "de"))
    translator.save(directory)
    source = tmp_path / "in.en"
    source.write_text(f"{SENTENCES[0]} {SENTENCES[1]}\n{SENTENCES[2]}\n", encoding="utf-8")
    for flags, expected in (([], [SENTENCES[0] + " " + SENTENCES[1], SENTENCES[2]]), (["--split-sentences"], None)):
        output = tmp_path / f"out{len(flags)}.de"
        cli.main(["translate", "--model-dir", str(directory), "--input", str(source), "--output", str(output), *flags])
        lines = output.read_text(encoding="utf-8").splitlines()
        if expected is None:
            first, second, third = translator.translate(SENTENCES[:3])
            assert lines == [f"{first} {second}", third]
        else:
            assert lines == translator.translate(expected)
    monkeypatch.setitem(sys.modules, "sentencex", None)
    with pytest.raises(SystemExit, match=r'^error: splitting sentences needs sentencex: pip install "keras-vaswani\[serve\]"'):
        cli.main(["translate", "--model-dir", str(directory), "--input", str(source), "--split-sentences"])
