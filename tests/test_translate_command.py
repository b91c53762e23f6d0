"""The translate, evaluate and plot-attention commands (keras_transformer/cli.py)."""

import os
import subprocess
import sys

import pytest
from conftest import in_one_pass
from translation_fixtures import SENTENCES

from keras_transformer import cli
from keras_transformer.decoding import Translator


@pytest.fixture(scope="module")
def model_dir(translation_model, translation_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("translator")
    Translator(translation_model, translation_tokenizer, beam_size=2, max_extra_length=6).save(directory)
    return directory


def test_cli_translates_a_file_line_by_line(model_dir, tmp_path, capsys):
    source = tmp_path / "input.en"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    output = tmp_path / "output.de"
    cli.main(["translate", "--model-dir", str(model_dir), "--input", str(source), "--output", str(output)])
    lines = output.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(SENTENCES)
    expected = Translator.load(model_dir).translate(SENTENCES)
    assert lines[:-1] == expected


@in_one_pass("torch", "the command's plumbing; each backend's search with a prefix is tested in test_translator.py")
def test_cli_target_prefix_begins_every_translation_and_the_search_goes_on(model_dir, tmp_path):
    texts = SENTENCES[:4]
    source = tmp_path / "input.en"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    output = tmp_path / "output.de"
    cli.main(["translate", "--model-dir", str(model_dir), "--input", str(source), "--output", str(output),
              "--target-prefix", "Die Frau"])
    lines = output.read_text(encoding="utf-8").split("\n")[:-1]
    translator = Translator.load(model_dir)
    expected = translator.translate(texts, target_prefix="Die Frau")
    assert lines == [text.replace("\r", " ").replace("\n", " ") for text in expected]  # one line each
    assert all(line.startswith("Die Frau") for line, text in zip(lines, texts) if text.strip())
    assert expected != translator.translate(texts)
    with pytest.raises(SystemExit, match=r"^error: target_prefix must be a list of fewer than max_extra_length=6 token"):
        cli.main(["translate", "--model-dir", str(model_dir), "--input", str(source), "--target-prefix",
                  "Die Frau sieht den alten Mann und den Hund"])


def test_cli_evaluate_prints_bleu_chrf_and_signatures(model_dir, tmp_path, capsys):
    import sacrebleu

    sources = [s for s in SENTENCES if s.strip()]
    references = [f"Referenz {i} ." for i in range(len(sources))]
    (tmp_path / "test.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    cli.main([
        "evaluate", "--model-dir", str(model_dir), "--source", str(tmp_path / "test.en"),
        "--reference", str(tmp_path / "test.de"), "--output", str(tmp_path / "hyp.de"),
    ])
    printed = capsys.readouterr().out
    hypotheses = (tmp_path / "hyp.de").read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    assert f"BLEU = {bleu.score:.2f}" in printed
    assert "chrF2 = " in printed
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in printed
    assert f"{len(sources)} sentences" in printed and "beam 2, alpha 0.6" in printed


def test_cli_reports_bad_files(model_dir, tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="a.en has 2 lines but .*a.de has 1"):
        cli.main(["evaluate", "--model-dir", str(model_dir), "--source", str(tmp_path / "a.en"),
                  "--reference", str(tmp_path / "a.de")])
    (tmp_path / "bad.en").write_bytes(b"fine\nnot \xff utf-8\n")
    with pytest.raises(SystemExit, match=r"bad.en:2: invalid UTF-8"):
        cli.main(["translate", "--model-dir", str(model_dir), "--input", str(tmp_path / "bad.en")])
    with pytest.raises(SystemExit, match="No model.keras in"):
        cli.main(["translate", "--model-dir", str(tmp_path / "missing")])
    for value in ("nan", "inf", "-1"):
        with pytest.raises(SystemExit, match=f"error: alpha must be a finite number >= 0. Received: alpha={value}"):
            cli.main(["translate", "--model-dir", str(model_dir), "--alpha", value])


@in_one_pass("torch", "reading a model directory's files and the CLI's error lines")
def test_cli_reports_damaged_model_directories_and_other_mistakes_in_one_line(model_dir, tmp_path):
    import shutil

    def damaged(name, file, content):
        directory = tmp_path / name
        shutil.copytree(model_dir, directory)
        (directory / file).write_bytes(content)
        return directory

    whole = (model_dir / "model.keras").read_bytes()
    (tmp_path / "in.en").write_text("the man .\n", encoding="utf-8")
    for directory, message in (
        (damaged("cut", "model.keras", whole[: len(whole) // 2]), r"cut/model.keras cannot be read as a Keras model \(not a zip archive\)"),
        (damaged("text", "model.keras", b"not a model"), r"text/model.keras cannot be read as a Keras model"),
        (damaged("vocabulary", "subword.model", b"\x08garbage"), r"vocabulary/subword.model cannot be read as a SentencePiece model"),
        (damaged("json", "translator.json", b"{beam_size: 4"), r"json/translator.json is not valid JSON"),
        (damaged("list", "translator.json", b"[4]"), r"list/translator.json must hold a JSON object; it holds list"),
        (damaged("setting", "translator.json", b'{"beam_size": "x"}'), r"setting/translator.json: beam_size must be an integer >= 1. Received: beam_size='x'"),
    ):
        with pytest.raises(SystemExit, match=f"^error: .*{message}"):
            cli.main(["translate", "--model-dir", str(directory), "--input", str(tmp_path / "in.en")])
    # A setting given now is named as given, not blamed on the file.
    with pytest.raises(SystemExit, match=r"^error: beam_size must be an integer >= 1. Received: beam_size=0"):
        cli.main(["translate", "--model-dir", str(model_dir), "--input", str(tmp_path / "in.en"), "--beam-size", "0"])
    for layer in ("2", "-3"):  # the tiny model has 2 decoder blocks
        with pytest.raises(SystemExit, match=rf"^error: The model has 2 decoder blocks, so layer must be an integer from -2 to 1 \(-1 is the last\). Received: layer={layer}"):
            cli.main(["plot-attention", "--model-dir", str(model_dir), "--text", "the man .", "--output", str(tmp_path / "a.png"), "--layer", layer])
    (tmp_path / "empty.en").write_bytes(b"")
    (tmp_path / "empty.de").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"^error: .*empty.en has no lines; expected a test set"):
        cli.main(["evaluate", "--model-dir", str(model_dir), "--source", str(tmp_path / "empty.en"), "--reference", str(tmp_path / "empty.de")])
    # A write that fails late (here: a full device) names the file.
    if os.path.exists("/dev/full"):
        with pytest.raises(SystemExit, match=r"^error: Cannot write /dev/full: No space left on device"):
            cli.main(["translate", "--model-dir", str(model_dir), "--input", str(tmp_path / "in.en"), "--output", "/dev/full"])


def test_cli_plot_attention_writes_a_png(model_dir, tmp_path, capsys):
    path = tmp_path / "attention.png"
    cli.main(["plot-attention", "--model-dir", str(model_dir), "--text", SENTENCES[0], "--output", str(path)])
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert f"Saved the cross-attention heatmap to {path}" in capsys.readouterr().out


def run_command(*args, stdin="", **environment):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_TRANSFORMER_QUIET")}
    return subprocess.run(
        [sys.executable, "-m", "keras_transformer", *map(str, args)],
        input=stdin.encode(), capture_output=True, timeout=300, env=env | environment,
    )


def test_python_dash_m_reads_stdin_and_writes_stdout_quietly(model_dir):
    result = run_command("translate", "--model-dir", model_dir, stdin="the man .\n\nthe dog .\n")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    lines = result.stdout.decode("utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    # No TensorFlow, XLA or SentencePiece log line reaches the user.
    assert result.stderr.decode() == ""


@in_one_pass("jax", "the CLI's warning lines; each backend's quiet translate is tested above")
def test_cli_warnings_are_one_line_and_count_lines_from_one(model_dir):
    long_line = " ".join(["the old man sees the dog ."] * 60)
    result = run_command("translate", "--model-dir", model_dir, stdin=f"the man .\n{long_line}\n")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    stderr = result.stderr.decode().splitlines()
    assert len(stderr) == 1, stderr
    assert stderr[0].startswith("warning: Line 2 (texts[1]) has ")
    assert "max_source_length=256" in stderr[0]


def test_cli_checks_the_output_path_before_any_work(tmp_path):
    # The model directory does not exist either: the output is checked first.
    for output, message in (
        (tmp_path / "missing" / "out.de", "the directory .*missing does not exist"),
        (tmp_path, "is a directory"),
    ):
        for command in (["translate"], ["plot-attention", "--text", "x"],
                        ["evaluate", "--source", "a", "--reference", "b"]):
            with pytest.raises(SystemExit, match=message):
                cli.main([*command, "--model-dir", str(tmp_path / "nothing"), "--output", str(output)])


def test_version_and_help_are_quiet(capsys):
    import keras_transformer

    result = run_command("--version")
    assert result.returncode == 0
    assert result.stdout.decode().startswith(f"keras-transformer {keras_transformer.__version__} (keras ")
    assert result.stderr.decode() == ""
    # --help is argparse's exit at the same point as --version, after the
    # same imports and start-up: in this process, its output alone differs.
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "--help"])
    printed = capsys.readouterr()
    assert exit_info.value.code == 0 and "--verbose" in printed.out
    assert printed.err == ""



def tune_pairs(translator, tmp_path, alpha):
    """`SENTENCES` with their translations by `translator` at `alpha` as
    references, written to valid.en and valid.<alpha>.de."""
    sources = [s for s in SENTENCES if s.strip()]
    references = translator.with_search(alpha=alpha).translate(sources)  # its model, loaded once
    (tmp_path / "valid.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / f"valid.{alpha}.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    return sources, references


def test_tune_search_scores_each_length_penalty_and_picks_the_best(model_dir, tmp_path):
    from keras_transformer.bleu import score_translations
    from keras_transformer.bleu import tune_search

    translator = Translator.load(model_dir)
    short = tune_pairs(translator, tmp_path, 0.0)[1]
    sources, long = tune_pairs(translator, tmp_path, 3.0)
    assert short != long  # the premise: the penalty changes some translations
    lines = []
    best, results = tune_search(translator, sources, long, [0.0, 3.0], log=lines.append)
    assert [(r["beam_size"], r["alpha"]) for r in results] == [(2, 0.0), (2, 3.0)]
    assert results[0]["bleu"] == score_translations(short, long)["bleu"] < 100.0
    assert results[1]["bleu"] == 100.0 and best is results[1]
    assert len(lines) == 2 and lines[1].startswith("beam 2, alpha 3.0: BLEU 100.00, chrF 100.00, BP 1.000")
    assert (translator.beam_size, translator.alpha) == (2, 0.6)  # the translator is not changed


@in_one_pass("torch", "the command's files and lines; each backend's search is tune_search's test above")
def test_cli_tune_saves_the_best_search_in_the_model_directory(model_dir, tmp_path, capsys):
    import json
    import shutil

    tune_pairs(Translator.load(model_dir), tmp_path, 0.0)
    directory = tmp_path / "translator"
    shutil.copytree(model_dir, directory)
    arguments = [
        "tune", "--model-dir", str(directory), "--source", str(tmp_path / "valid.en"),
        "--reference", str(tmp_path / "valid.0.0.de"),
    ]
    cli.main([*arguments, "--alphas", "3", "0", "--save"])
    printed = capsys.readouterr().out
    assert "beam 2, alpha 3.0: BLEU " in printed
    assert "best: beam 2, alpha 0.0 (BLEU 100.00)" in printed
    saved = Translator.load(directory)
    assert (saved.beam_size, saved.alpha, saved.max_extra_length) == (2, 0.0, 6)
    # Without --save the directory keeps its settings; beam sizes are tried too.
    cli.main([*arguments, "--alphas", "1", "2", "--beam-sizes", "1"])
    printed = capsys.readouterr().out
    assert "best: beam 1, alpha 1.0" in printed and "alpha 2.0" not in printed  # greedy: no penalty to try
    assert json.loads((directory / "translator.json").read_text())["alpha"] == 0.0


@in_one_pass("torch", "the command's checks of its arguments and files, the same under every backend")
def test_cli_tune_reports_bad_settings_and_files_in_one_line(model_dir, tmp_path):
    (tmp_path / "valid.en").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "valid.de").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "short.de").write_text("eins\n", encoding="utf-8")
    arguments = ["tune", "--model-dir", str(model_dir), "--source", str(tmp_path / "valid.en")]
    good = [*arguments, "--reference", str(tmp_path / "valid.de")]
    with pytest.raises(SystemExit, match="error: alpha must be a finite number >= 0. Received: alpha=-1"):
        cli.main([*good, "--alphas", "0.6", "-1"])
    with pytest.raises(SystemExit, match="error: beam_size must be an integer >= 1. Received: beam_size=0"):
        cli.main([*good, "--beam-sizes", "0"])
    with pytest.raises(SystemExit, match="valid.en has 2 lines but .*short.de has 1; a validation set"):
        cli.main([*arguments, "--reference", str(tmp_path / "short.de")])
