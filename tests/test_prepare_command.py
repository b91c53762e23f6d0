"""`keras-transformer prepare`, then `train --train-data`: docs/data.md's
"prepare once" commands on toy files; bad input as one `error:` line."""

import json
import re

import pytest
from conftest import in_one_pass
from test_train_command import cli
from test_train_command import files  # noqa: F401 (a fixture)

from keras_transformer.cli import main

pytestmark = in_one_pass("torch", "command-line plumbing over the data code the data tests cover")


def test_prepare_in_this_process_writes_a_set_that_train_reads(files, tmp_path, capsys):  # noqa: F811
    """The quick tier's run of the command: the set and its vocabulary."""
    from keras_transformer.data import SubwordTokenizer
    from keras_transformer.data.prepared import load_prepared

    prepared = tmp_path / "prepared"
    main(["prepare", "--source", str(files / "train.en.gz"), "--target", str(files / "train.de.gz"),
          "--vocabulary-size", "320", "--output", str(prepared)])
    assert "Prepared 300 pairs" in capsys.readouterr().out
    assert json.loads((prepared / "manifest.json").read_text())["pairs"] == 300
    assert len(load_prepared(prepared, SubwordTokenizer.load(prepared))) == 300


def test_prepare_then_train_from_the_prepared_set(files, tmp_path):  # noqa: F811
    prepared = tmp_path / "prepared"
    result = cli("prepare", "--source", files / "train.en.gz", "--target", files / "train.de.gz",
                 "--vocabulary-size", 320, "--output", prepared)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Prepared 300 pairs" in result.stdout and f"train --train-data {prepared}" in result.stdout
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["pairs"] == 300 and (prepared / "subword.model").is_file()
    model_dir = tmp_path / "run"
    trained = cli("train", "--train-data", prepared, "--valid-source", files / "valid.en",
                  "--valid-target", files / "valid.de", "--model-dir", model_dir, "--preset", "tiny",
                  "--num-layers", 1, "--tokens-per-batch", 512, "--max-tokens", 16, "--train-steps", 2,
                  "--checkpoint-every", 2, "--valid-bleu-sentences", 0)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f"vocabulary: 320 pieces from {prepared}" in trained.stdout
    assert f"train: 300 pairs from {prepared}" in trained.stdout
    assert (model_dir / "model.keras").is_file() and not (model_dir / "data").exists()
    # Text files beside a prepared set: one or the other.
    both = cli("train", "--train-data", prepared, "--train-source", files / "train.en.gz",
               "--train-target", files / "train.de.gz", "--valid-source", files / "valid.en",
               "--valid-target", files / "valid.de", "--model-dir", tmp_path / "both")
    assert both.returncode == 1 and both.stderr.startswith("error: Give either train_data")


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--source", "missing.en", "--target", "{valid.de}"], r"error: No such file: missing.en"),
        (["--source", "{valid.en}", "{valid.en}", "--target", "{valid.de}"], r"error: --source and --target must name as many files"),
        (["--source", "{valid.en}", "--target", "{short.de}"], r"error: Parallel files must have one line per sentence pair, but .*short.de ends after 5 lines"),
        (["--source", "{valid.en}", "--target", "{valid.de}", "--vocabulary-size", "10"], r"error: --vocabulary-size must be an integer >= 300; received 10"),
        (["--source", "{valid.en}", "--target", "{valid.de}", "--vocabulary", "{nowhere}"], r"error: No tokenizer in .*nowhere: expected subword.model"),
    ],
)
def test_bad_input_is_one_error_line(files, tmp_path, arguments, message):  # noqa: F811
    """In this process, as `main` ends a command; the first case also as a
    command of its own, whose stderr holds that one line and no traceback."""
    (tmp_path / "short.de").write_text("".join((files / "valid.de").read_text().splitlines(True)[:5]))
    names = {"valid.en": files / "valid.en", "valid.de": files / "valid.de",
             "short.de": tmp_path / "short.de", "nowhere": tmp_path / "nowhere"}
    arguments = [str(names[a[1:-1]]) if a.startswith("{") else a for a in arguments]
    if "--vocabulary-size" not in arguments:
        arguments += ["--vocabulary-size", "320"]
    arguments = ["prepare", *arguments, "--output", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert re.fullmatch(message + ".*", str(exit_info.value)) and "\n" not in str(exit_info.value)
    if "missing.en" in arguments:
        result = cli(*arguments)
        assert result.returncode == 1, result.stdout + result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert re.search(message, result.stderr), result.stderr
