"""A translator's language pair: its codes, where `train` and `convert`
find it, and how it is saved."""

import pytest
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)

from keras_transformer.data import languages
from keras_transformer.decoding import Translator
from keras_transformer.training.config import TrainingConfig


def test_codes_pairs_and_file_suffixes():
    assert languages.check_pair(["en", "pt-BR"]) == ("en", "pt-BR")
    assert languages.parse_pair("en-de") == ("en", "de")
    assert languages.parse_pair("en:pt-BR") == ("en", "pt-BR")
    assert languages.pair_or_none("en", "ROMANCE") is None
    assert languages.pair_or_none(None, "de") is None
    for path, code in [("data/train.en", "en"), ("train.de.gz", "de"), ("train.txt", None), ("en", None),
                       ("corpus.tok", None)]:
        assert languages.language_of_file(path) == code, path
    assert languages.name_of("de-AT") == "German" and languages.name_of("qqq") == "qqq"
    for bad, message in [("english", "Received: 'english'"), ("", "Received: ''"), ("EN", "Received: 'EN'")]:
        with pytest.raises(ValueError, match=f"language code such as 'en'.*{message}"):
            languages.check_pair((bad, "de"))
    with pytest.raises(ValueError, match=r"pair of language codes.*Received: languages='en-de'"):
        languages.check_pair("en-de")
    with pytest.raises(ValueError, match="two codes such as en-de.*Received: 'ende'"):
        languages.parse_pair("ende")


def test_a_translator_saves_its_pair_and_loads_it_or_an_override(model, tokenizer, tmp_path):  # noqa: F811
    Translator(model, tokenizer, languages=("en", "de")).save(tmp_path / "a")
    assert Translator.load(tmp_path / "a").languages == ("en", "de")
    assert Translator.load(tmp_path / "a").with_search(beam_size=1).languages == ("en", "de")
    assert Translator.load(tmp_path / "a", languages=["de", "en"]).languages == ("de", "en")
    Translator(model, tokenizer).save(tmp_path / "b")
    assert Translator.load(tmp_path / "b").languages is None
    with pytest.raises(ValueError, match="Received: languages='en'"):
        Translator(model, tokenizer, languages="en")


def test_a_training_run_takes_its_pair_from_the_files_or_its_options(tmp_path):
    config = TrainingConfig(model_dir=str(tmp_path), train_source=["data/train.en.gz"], train_target=["data/train.de"])
    assert (config.source_language, config.target_language) == ("en", "de")
    config = TrainingConfig(model_dir=str(tmp_path), train_source=["a.txt"], train_target=["b.txt"])
    assert (config.source_language, config.target_language) == (None, None)
    config = TrainingConfig(model_dir=str(tmp_path), train_source=["a.txt"], train_target=["b.txt"],
                            source_language="en", target_language="pt-BR")
    assert (config.source_language, config.target_language) == ("en", "pt-BR")
    with pytest.raises(ValueError, match="`target_language` must be a language code.*Received: 'German'"):
        TrainingConfig(model_dir=str(tmp_path), train_source=["a.en"], train_target=["b.de"], target_language="German")
