"""Streaming translation (keras_transformer/decoding/streaming.py): windows,
shards, and an interrupted output continued without translating a line twice."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import in_one_pass
from translation_fixtures import SENTENCES

from keras_transformer import cli
from keras_transformer.decoding import Translator
from keras_transformer.decoding import streaming
from keras_transformer.decoding import translate_file

LINES = [f"{sentence} {i % 3 * 'the dog .'}".strip() if sentence.strip() else sentence
         for i, sentence in enumerate(SENTENCES * 4)]  # 32 lines, blank ones among them


@pytest.fixture(scope="module")
def translator(translation_model, translation_tokenizer):
    return Translator(translation_model, translation_tokenizer, beam_size=1, max_extra_length=4, batch_size=4)


@pytest.fixture(scope="module")
def expected(translator):
    return translator.translate(LINES)


class Counting:
    """A translator that counts the lines it is asked to translate."""

    def __init__(self, translator, fail_after=None):
        self.translator = translator
        self.lines = 0
        self.calls = 0
        self.fail_after = fail_after

    def translate(self, texts, first_line=0):
        if self.fail_after is not None and self.calls == self.fail_after:
            raise KeyboardInterrupt("stopped on purpose")
        self.calls += 1
        self.lines += len(texts)
        return self.translator.translate(texts, first_line)

    def get_config(self):
        return self.translator.get_config()


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read(path):
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@in_one_pass("jax", "streaming is host code around the translator")
def test_translate_stream_yields_each_window_before_reading_the_next(translator, expected):
    read_so_far = []

    def lines():
        for line in LINES:
            read_so_far.append(line)
            yield line

    stream = translator.translate_stream(lines(), window=5)
    assert next(stream) == expected[0]
    assert len(read_so_far) == 5  # one window read, not the whole input
    assert [expected[0]] + list(stream) == expected
    with pytest.raises(ValueError, match="window must be an integer >= 1 line. Received: window=0"):
        list(translator.translate_stream(LINES, window=0))


@in_one_pass("jax", "streaming is host code around the translator")
def test_translate_file_writes_in_windows_what_translate_gives(translator, expected, tmp_path):
    source = write(tmp_path / "in.en", LINES)
    summary = translate_file(translator, source, tmp_path / "out.de", window=3)
    assert read(tmp_path / "out.de") == expected
    assert (summary.translated, summary.kept) == (len(LINES), 0)
    assert not os.path.exists(tmp_path / "out.de.partial") and not os.path.exists(tmp_path / "out.de.partial.json")
    # gzipped input, and a last line without its newline
    with gzip.open(tmp_path / "in.en.gz", "wb") as file:
        file.write("\n".join(LINES).encode("utf-8"))
    translate_file(translator, tmp_path / "in.en.gz", tmp_path / "gz.de", window=7)
    assert read(tmp_path / "gz.de") == expected


@in_one_pass("jax", "streaming is host code around the translator")
def test_shards_put_together_are_the_whole_translation(translator, expected, tmp_path):
    source = write(tmp_path / "in.en", LINES)
    parts = []
    for index in range(3):
        translate_file(translator, source, tmp_path / f"out.{index}", window=4, shard=(index, 3))
        parts.append(read(tmp_path / f"out.{index}"))
    assert [len(part) for part in parts] == [10, 11, 11]
    assert sum(parts, []) == expected
    for text in ("3/3", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match=f"A shard is written i/n with 0 <= i < n.*Received: '{text}'"):
            streaming.parse_shard(text)


@in_one_pass("jax", "streaming is host code around the translator")
def test_an_interrupted_output_is_continued_without_translating_a_line_twice(translator, expected, tmp_path):
    source = write(tmp_path / "in.en", LINES)
    output = tmp_path / "out.de"
    output.write_text("an earlier, finished translation\n", encoding="utf-8")
    stopped = Counting(translator, fail_after=3)
    with pytest.raises(KeyboardInterrupt):
        translate_file(stopped, source, output, window=4)
    assert stopped.lines == 12
    assert read(output) == ["an earlier, finished translation"]  # untouched until the new one is whole
    state = json.loads((tmp_path / "out.de.partial.json").read_text())
    assert (state["lines"], len(read(tmp_path / "out.de.partial"))) == (12, 12)
    # A kill in the next window's write, after two of its lines and part of a
    # third: its complete lines are kept, the torn one is not.
    with open(tmp_path / "out.de.partial", "ab") as file:
        file.write("".join(line + "\n" for line in expected[12:14]).encode("utf-8") + b"torn li")
    logged = []
    counting = Counting(translator)
    summary = translate_file(counting, source, output, window=4, log=logged.append)
    assert read(output) == expected
    assert counting.lines == len(LINES) - 14 and (summary.kept, summary.translated) == (14, len(LINES) - 14)
    assert logged == [f"continuing {output}.partial: 14 lines kept from an interrupted run, translating from line 15"]
    assert not os.path.exists(tmp_path / "out.de.partial.json")


@in_one_pass("jax", "streaming is host code around the translator")
def test_an_interrupted_output_of_another_input_or_search_is_refused(translator, tmp_path):
    source = write(tmp_path / "in.en", LINES)
    output = tmp_path / "out.de"
    with pytest.raises(KeyboardInterrupt):
        translate_file(Counting(translator, fail_after=2), source, output, window=4)
    other = translator.with_search(beam_size=2)
    with pytest.raises(ValueError, match=r"out.de.partial is an interrupted translation of another settings .*beam_size"):
        translate_file(other, source, output, window=4)
    write(source, ["a different first line"] + LINES[1:])
    with pytest.raises(ValueError, match=r"The input's first 8 lines differ from those translated in .*out.de.partial"):
        translate_file(translator, source, output, window=4)
    with pytest.raises(ValueError, match=r"out.de.partial is an interrupted translation of another shard"):
        translate_file(translator, source, output, window=4, shard=(0, 2))


@pytest.fixture(scope="module")
def model_dir(translator, tmp_path_factory):
    directory = tmp_path_factory.mktemp("streaming_translator")
    translator.save(directory)
    return directory


@in_one_pass("jax", "streaming is host code around the translator")
def test_cli_translate_killed_halfway_continues_to_the_same_file(model_dir, tmp_path, monkeypatch, capsys):
    lines = LINES * 6  # 192 lines, 48 windows of 4
    source = write(tmp_path / "in.en", lines)
    output = tmp_path / "out.de"
    command = [sys.executable, "-m", "keras_transformer", "translate", "--model-dir", str(model_dir),
               "--input", str(source), "--output", str(output), "--window", "4"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state = tmp_path / "out.de.partial.json"
    deadline = time.monotonic() + 300
    written = 0
    while written < 8 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
        try:
            written = json.loads(state.read_text())["lines"]
        except (OSError, ValueError, KeyError):  # not there yet, or being replaced
            pass
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = len(read(tmp_path / "out.de.partial"))
    assert 8 <= kept < len(lines), "the run was not killed halfway"
    assert not output.exists()

    counted = []
    original = Translator.translate

    def counting(self, texts, first_line=0):
        counted.append(len(texts))
        return original(self, texts, first_line)

    monkeypatch.setattr(Translator, "translate", counting)
    cli.main(command[3:] + ["--progress"])
    err = capsys.readouterr().err
    assert sum(counted) == len(lines) - kept
    assert f"continuing {output}.partial: {kept:,} lines kept from an interrupted run" in err
    assert f"translated {len(lines)} of {len(lines)} lines (100.0%)" in err
    monkeypatch.undo()
    # A sentence translates alike in any batch (test_translator.py).
    assert read(output) == Translator.load(model_dir).translate(LINES) * 6


@in_one_pass("jax", "the command line's error lines")
def test_cli_translate_reports_bad_shards_and_windows_in_one_line(model_dir, tmp_path):
    source = write(tmp_path / "in.en", LINES)
    base = ["translate", "--model-dir", str(model_dir)]
    with pytest.raises(SystemExit, match=r"^error: A shard is written i/n"):
        cli.main(base + ["--input", str(source), "--shard", "2/2"])
    with pytest.raises(SystemExit, match=r"^error: --shard splits a file by its line count; give it with --input"):
        cli.main(base + ["--shard", "0/2"])
    with pytest.raises(SystemExit, match=r"^error: window must be an integer >= 1 line. Received: window=0"):
        cli.main(base + ["--input", str(source), "--output", str(tmp_path / "o"), "--window", "0"])
