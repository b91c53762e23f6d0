"""The search's settings (keras_transformer/decoding/settings.py): one value
from the command line and `Translator` down to the search."""

import argparse
import contextlib
import io

import pytest
from conftest import in_one_pass

from keras_transformer import cli
from keras_transformer.decoding import Translator
from keras_transformer.decoding import settings
from keras_transformer.decoding.settings import SearchSettings

pytestmark = in_one_pass("jax", "Python values and argument parsing, the same under every backend")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"beam_size": 0}, r"beam_size must be an integer >= 1. Received: beam_size=0"),
        ({"min_length": -1}, r"min_length must be an integer >= 0. Received: min_length=-1"),
        ({"min_length": 2.5}, r"min_length must be an integer >= 0. Received: min_length=2.5"),
        ({"alpha": float("nan")}, r"alpha must be a finite number >= 0. Received: alpha=nan"),
        ({"length_penalty": "linear"}, r"length_penalty must be one of \['gnmt', 'power'\]. Received: length_penalty='linear'"),
        ({"target_prefix": [5, 0]}, r"target_prefix must be a list of fewer than max_extra_length=50 token ids above 0"),
        ({"early_stopping": "sometimes"}, r"early_stopping must be 'never', True or False. Received: early_stopping='sometimes'"),
        ({"early_stopping": 1}, r"Received: early_stopping=1"),
    ],
)
def test_bad_settings_are_refused_with_what_was_received(changes, message):
    with pytest.raises(ValueError, match=message):
        SearchSettings().replace(**changes)


def test_replace_names_the_settings_there_are():
    with pytest.raises(TypeError, match=r"Unknown search settings \['beam'\]; expected some of \['beam_size', "):
        SearchSettings().replace(beam=2)
    changed = SearchSettings().replace(beam_size=1, min_length=3)
    assert (changed.beam_size, changed.min_length, changed.alpha) == (1, 3, 0.6)
    assert SearchSettings.from_config(changed.get_config()) == changed


def test_each_flagged_setting_is_a_flag_that_is_none_unless_given():
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    assert settings.from_arguments(parser.parse_args([])) == {}
    args = parser.parse_args(["--beam-size", "2", "--min-length", "5", "--length-penalty", "power", "--early-stopping", "true"])
    assert settings.from_arguments(args) == {"beam_size": 2, "min_length": 5, "length_penalty": "power", "early_stopping": True}
    with pytest.raises(SystemExit):
        parser.parse_args(["--force-eos"])  # set by convert, not a flag


def test_a_translator_reads_saves_and_loads_its_settings(translation_model, translation_tokenizer, tmp_path):
    translator = Translator(translation_model, translation_tokenizer, beam_size=2, min_length=3, max_extra_length=6)
    assert translator.search_settings == SearchSettings(beam_size=2, min_length=3, max_extra_length=6)
    assert (translator.beam_size, translator.min_length, translator.target_prefix) == (2, 3, ())
    assert translator.with_search(beam_size=1).search_settings == translator.search_settings.replace(beam_size=1)
    translator.save(tmp_path)
    assert Translator.load(tmp_path).search_settings == translator.search_settings
    with pytest.raises(TypeError, match="Unknown search settings"):
        Translator(translation_model, translation_tokenizer, beams=2)
    with pytest.raises(SystemExit, match=r"^error: min_length must be an integer >= 0. Received: min_length=-1$"):
        cli.main(["translate", "--model-dir", str(tmp_path), "--min-length", "-1"])



def test_the_decoding_guide_s_settings_block_prints_what_it_shows(translation_model, translation_tokenizer):
    import pathlib
    import re

    import keras_transformer as kt

    guide = (pathlib.Path(__file__).parent.parent / "docs" / "decoding.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "kt.decoding.SearchSettings(" in b)
    printed = io.StringIO()
    namespace = {"kt": kt, "model": translation_model, "tokenizer": translation_tokenizer}
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "docs/decoding.md", "exec"), namespace)
    shown = re.search(r"print\(.*# (.*)", block).group(1)
    assert printed.getvalue().strip() == shown
    assert namespace["translator"].search_settings == kt.decoding.SearchSettings(
        beam_size=2, min_length=3, max_extra_length=20)
