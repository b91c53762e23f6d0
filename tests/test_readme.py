"""The README's commands and examples, run as a user runs them.

The quick start runs with its defaults in a fresh directory (once per
version of the code: see `workdir`); every example the README shows is then
run there, under this backend, against the model it trained, and must print
what the README says it prints.
"""

import ast
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import keras
import pytest
from conftest import in_one_pass, made_once_across_passes, slow

import keras_transformer as kt
from keras_transformer import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_commands():
    """The README's first screen gives the quick tier's command and the full
    tier's; CI runs the full one as it stands there."""
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"test_command='([^']+)'", ci).group(1)
    first_screen = README.split("## ")[0]
    commands = [line for line in first_screen.splitlines() if "python -m pytest" in line and not line.startswith("#")]
    quick = 'pip install -e ".[test]" && python -m pytest'
    assert commands == [quick, f"{quick} --run-slow"] and command == commands[1]
    assert "python recipes/quickstart.py" in first_screen
    assert (ROOT / "recipes" / "quickstart.py").is_file()


def test_the_readme_names_the_distribution_that_pyproject_builds():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    first_screen = README.split("## ")[0]
    assert README.startswith(f"# {project['name']}\n")
    assert f"`{project['name']}` distribution, imported as `keras_transformer`" in first_screen
    assert project["scripts"]["keras-transformer"] == "keras_transformer.cli:main"
    # PyPI's keras-transformer is someone else's: no doc installs it by name,
    # and every install by name, in the docs or an error line, is ours.
    texts = [README, *(path.read_text() for path in (ROOT / "docs").glob("*.md"))]
    texts += [path.read_text() for path in (ROOT / "keras_transformer").rglob("*.py")]
    for text in texts:
        assert not re.search(r"pip install \S*keras[-_]transformer", text)
        for named in re.findall(r"pip install \"?([a-z-]+)\[", text):
            assert named == project["name"], named


def code_blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands_with_output(block):
    """(command, shown output lines) pairs of a bash block: a command, with
    its continuation lines joined, then the `# ` lines under it."""
    pairs = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith("# ") and pairs:
            pairs[-1][1].append(line[2:])
        elif line.strip() and not line.startswith("#"):
            pairs.append((line.split("   #")[0].strip(), []))
    return pairs


def run_quickstart(directory, *arguments, backend=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "quickstart.py"), *arguments],
        cwd=directory, capture_output=True, text=True, timeout=1200,
        env=dict(os.environ, KERAS_BACKEND=backend or keras.backend.backend()),
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request):
    """A directory in which `python recipes/quickstart.py` has run.

    The run is the README's command as it stands, so under TensorFlow, the
    default backend, in every pass. It takes minutes, so its result is made
    once across CI's passes (`made_once_across_passes`), and every pass
    then runs every example under its own backend on that model (a
    `.keras` model loads under any backend).
    `test_the_quick_start_runs_under_this_backend` runs the quick start
    itself under the other backends.
    """
    saved = quickstart_run(request)
    directory = tmp_path_factory.mktemp("user")
    shutil.copytree(saved, directory, dirs_exist_ok=True)
    return directory


def quickstart_run(request):
    """The quick start's cached run (conftest.py starts it as soon as the
    tests are collected)."""
    return made_once_across_passes(request, "quickstart", train_quickstart, ROOT / "recipes" / "quickstart.py")


def train_quickstart(directory):
    result = run_quickstart(directory, backend="tensorflow")
    assert result.returncode == 0, result.stderr[-3000:]
    (directory / "quickstart.log").write_text(result.stdout + result.stderr)
    return directory


NOISE = re.compile(r"^[IWE]\d{4} |LOG\(INFO\)|Warning", re.M)


@slow  # needs `workdir`, the quick start's training
def test_the_quick_start_trains_translates_and_scores(workdir):
    output = (workdir / "quickstart.log").read_text()
    assert re.search(r"^Backend: tensorflow$", output, re.M)
    scores = [float(s) for s in re.findall(r"^  BLEU = ([\d.]+)", output, re.M)]
    assert len(scores) == 2 and min(scores) >= 98.0, output[-3000:]
    assert output.count("nrefs:1|case:mixed|eff:no|tok:13a") == 2
    assert "exact translations (beam 4), subordinate clause (verb last)" in output
    # Nothing but the quick start's own lines: no log line to learn to ignore.
    assert not NOISE.search(output), output
    translator = kt.Translator.load(workdir / "runs" / "quickstart")
    assert (translator.beam_size, translator.alpha) == (4, 0.6)
    assert (workdir / "runs" / "quickstart" / "test.en").is_file()
    valid = (workdir / "runs" / "quickstart" / "valid.en").read_text().splitlines()
    assert len(valid) == len((workdir / "runs" / "quickstart" / "valid.de").read_text().splitlines()) == 500


@slow  # needs `workdir`, the quick start's training
def test_the_quick_start_runs_under_this_backend(workdir, tmp_path):
    """The whole quick start under TensorFlow (the cached run's), and the
    same script on a small corpus under the other backends."""
    output = (workdir / "quickstart.log").read_text()
    if f"Backend: {keras.backend.backend()}\n" not in output:
        result = run_quickstart(
            tmp_path, "--train-size", "400", "--valid-size", "20", "--test-size", "20", "--epochs", "1"
        )
        assert result.returncode == 0, result.stderr[-3000:]
        output = result.stdout + result.stderr
        assert (tmp_path / "runs" / "quickstart" / "model.keras").is_file()
    assert f"Backend: {keras.backend.backend()}\n" in output
    assert len(re.findall(r"^  BLEU = ([\d.]+)", output, re.M)) == 2
    assert not NOISE.search(output), output


@in_one_pass("torch", "the README's text; each backend's translate command is tested in test_translate_command.py")
@slow  # needs `workdir`, the quick start's training
def test_the_readme_translate_example_prints_what_it_shows(workdir):
    pairs = [
        (command, shown)
        for block in code_blocks("bash")
        for command, shown in commands_with_output(block)
        if command.startswith("echo ") and "translate" in command
    ]
    assert pairs
    for command, shown in pairs:
        text, arguments = command.split(" | ")
        arguments = shlex.split(arguments)
        assert arguments[:3] == ["python", "-m", "keras_transformer"]
        result = subprocess.run(
            [sys.executable, *arguments[1:]], input=shlex.split(text)[1] + "\n",
            cwd=workdir, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.splitlines() == shown
        assert result.stderr == ""


@in_one_pass("tensorflow", "the README's text; each backend's commands are tested in test_translate_command.py")
@slow  # needs `workdir`, the quick start's training
def test_the_readme_command_line_examples_print_what_they_show(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    block = next(b for b in code_blocks("bash") if "plot-attention" in b and "evaluate" in b)
    for command, shown in commands_with_output(block):
        arguments = shlex.split(command)
        assert arguments[:3] == ["python", "-m", "keras_transformer"]
        cli.main(arguments[3:])
        printed = capsys.readouterr().out.splitlines()
        if shown:
            assert printed == shown
        if arguments[3] == "evaluate":
            bleu = float(re.search(r"BLEU = ([\d.]+)", "\n".join(printed)).group(1))
            assert bleu >= 98.0
        if arguments[3] == "tune":
            assert re.search(r"^best: beam 4, alpha (0\.6|1\.0) \(BLEU [\d.]+\)$", "\n".join(printed), re.M)
    source = (workdir / "runs" / "quickstart" / "test.en").read_text().splitlines()
    assert len((workdir / "runs" / "quickstart" / "test.out").read_text().splitlines()) == len(source)
    assert (workdir / "runs" / "attention.png").read_bytes()[:4] == b"\x89PNG"


@slow  # needs `workdir`, the quick start's training
def test_the_readme_python_examples_return_what_they_show(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    block = next(b for b in code_blocks("python") if 'kt.Translator.load("runs/quickstart")' in b)
    namespace = {"kt": kt}
    for line in block.splitlines():
        code, _, comment = line.partition("   #")
        comment = comment.strip()
        if comment.startswith("["):
            assert eval(code.strip(), namespace) == ast.literal_eval(comment), line
        elif "n_best" in code:
            best = eval(code.strip(), namespace)[0]
            assert len(best) == 4 and [s for _, s in best] == sorted((s for _, s in best), reverse=True)
            assert best[0][0] == namespace["translator"].translate(["The old man sees the dog."])[0]
        else:
            exec(code, namespace)
    assert namespace["greedy"].translate(["The old man sees the dog."]) == ["Der alte Mann sieht den Hund."]


@in_one_pass("tensorflow", "the README's text; each backend's export is tested in test_export.py")
@slow  # needs `workdir`, the quick start's training
def test_the_readme_export_serves_the_curl_example(workdir, monkeypatch, capsys):
    import json

    import tensorflow as tf

    monkeypatch.chdir(workdir)
    block = next(b for b in code_blocks("bash") if "docker run" in b)
    export = next(c for c, _ in commands_with_output(block) if "export" in c)
    cli.main(shlex.split(export)[3:])
    assert "saved_models/quickstart/1" in capsys.readouterr().out
    request = json.loads(re.search(r"-d '(\{.*\})'", block).group(1))
    served = tf.saved_model.load("saved_models/quickstart/1").signatures["serving_default"]
    translations = served(text=tf.constant(request["instances"]))["translation"].numpy()
    assert [t.decode() for t in translations] == kt.Translator.load("runs/quickstart").translate(request["instances"])


@in_one_pass("torch", "the README's text; each backend's server is tested in test_serve.py")
@slow  # needs `workdir`, the quick start's training
def test_the_readme_serve_command_answers_its_curl_example(workdir):
    """The README's serve command, on a free port and without the warm-up
    (minutes of compiling every shape, which tests/test_serve.py leaves out
    too), answers its curl with what the README shows."""
    import signal
    import time

    from process_runs import free_port

    block = next(b for b in code_blocks("bash") if "keras_transformer serve" in b)
    (serve, _), (curl, shown) = commands_with_output(block)
    port = str(free_port())
    arguments = shlex.split(serve.rstrip("&"))
    assert arguments[:4] == ["python", "-m", "keras_transformer", "serve"]
    process = subprocess.Popen(
        [sys.executable, *arguments[1:], "--port", port, "--no-warm-up"], cwd=workdir,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout.readline().startswith(f"Serving en-de (runs/quickstart) at http://127.0.0.1:{port} on ")
        curl = shlex.split(curl.replace("localhost:5000", f"localhost:{port}"))
        deadline = time.time() + 120
        while (result := subprocess.run(curl, capture_output=True, text=True, timeout=300)).returncode != 0:
            assert time.time() < deadline and process.poll() is None, process.stderr.read()[-2000:]
            time.sleep(0.2)
        assert result.stdout.splitlines() == shown
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()
