"""Under JAX and PyTorch the package trains, resumes, translates, evaluates
and plots with no TensorFlow: the commands run, one after another, in a
process in which `import tensorflow` fails (tests/without_tensorflow/sitecustomize.py)."""

import os
import subprocess
import sys
import types

import keras
import pytest
from conftest import slow

from keras_transformer import training as kt_training
from keras_transformer.data import builtin_corpus

pytestmark = pytest.mark.skipif(
    keras.backend.backend() == "tensorflow",
    reason="the TensorFlow backend is TensorFlow; JAX and PyTorch must do without it",
)
HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "without_tensorflow")


def without_tensorflow():
    """This process's environment, with the hook that makes TensorFlow absent."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [HOOK, environment.get("PYTHONPATH")]))
    return environment


# Several commands in one process without TensorFlow: each is `main(args)`,
# its output and exit status kept apart, the status as a process of its own
# would end with (`SystemExit("error: ...")` prints the line and exits 1).
# One start instead of one a command.
COMMANDS_SCRIPT = """
import contextlib, io, json, sys
from keras_transformer.cli import main
results = []
for arguments in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(arguments)
        except SystemExit as exit:
            code = exit.code
    message = code + "\\n" if isinstance(code, str) else ""
    code = 1 if message else code or 0
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue() + message})
print(json.dumps(results))
"""


def commands(*argument_lists):
    """Runs `keras-transformer` commands in one process without TensorFlow;
    a list of `{"returncode", "stdout", "stderr"}`."""
    import json

    process = subprocess.run(
        [sys.executable, "-c", COMMANDS_SCRIPT, json.dumps([[str(a) for a in args] for args in argument_lists])],
        capture_output=True, text=True, env=without_tensorflow(), timeout=600,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return [types.SimpleNamespace(**result) for result in json.loads(process.stdout.splitlines()[-1])]


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run trained, resumed, and then used by the other commands (translate,
    evaluate, plot-attention, export), all in one process without TensorFlow:
    the model directory, and each command's result by its name."""
    directory = tmp_path_factory.mktemp("without_tensorflow")
    train, valid = builtin_corpus("train", size=300, seed=4), builtin_corpus("valid", size=20)
    files = {
        name: write(directory / name, lines)
        for name, lines in (
            ("train.en", train.sources), ("train.de", train.targets),
            ("valid.en", valid.sources), ("valid.de", valid.targets),
            ("test.en", builtin_corpus("test", size=3).sources), ("test.de", builtin_corpus("test", size=3).targets),
        )
    }
    model_dir = directory / "run"
    common = ["--model-dir", model_dir, "--preset", "tiny", "--num-layers", "1", "--vocabulary-size", 400,
              "--tokens-per-batch", 1024, "--max-tokens", 48, "--checkpoint-every", 2,
              "--valid-bleu-sentences", 2, "--valid-metrics", "loss", "chrf", "--log-every", 1, "--beam-size", 2,
              "--max-extra-length", 4]
    names = ("first", "resumed", "translated", "evaluated", "plotted", "exported")
    results = dict(zip(names, commands(
        ["train", "--train-source", files["train.en"], "--train-target", files["train.de"],
         "--valid-source", files["valid.en"], "--valid-target", files["valid.de"], "--train-steps", 2, *common],
        ["train", "--resume", "--model-dir", model_dir, "--train-steps", 4],
        ["translate", "--model-dir", model_dir, "--input", files["test.en"]],
        ["evaluate", "--model-dir", model_dir, "--source", files["test.en"], "--reference", files["test.de"]],
        ["plot-attention", "--model-dir", model_dir, "--text", builtin_corpus("test", size=3).sources[0],
         "--output", directory / "attention.png"],
        ["export", "--model-dir", model_dir, "--output", model_dir / "exported"],
    ), strict=True))
    for name in ("first", "resumed"):
        assert results[name].returncode == 0, results[name].stdout + results[name].stderr
    return directory, model_dir, results


@slow  # needs `trained`, two training runs
def test_train_and_resume_without_tensorflow(trained):
    _, model_dir, results = trained
    first, resumed = results["first"], results["resumed"]
    assert "prepared the training text into" in first.stdout
    assert "checkpoint at step 2" in first.stdout
    # The resumed run reads the prepared arrays, not the text, and goes on.
    assert "prepared the training text" not in resumed.stdout
    assert f"train: 300 pairs from {model_dir / 'data'}" in resumed.stdout
    assert "checkpoint at step 4" in resumed.stdout and "checkpoint at step 2" not in resumed.stdout
    assert (model_dir / "model.keras").is_file()


@slow  # needs `trained`, two training runs
def test_train_writes_its_curves_without_tensorflow(trained):
    _, model_dir, results = trained
    first, resumed = results["first"], results["resumed"]
    curve = kt_training.read_curve(model_dir / "train_curve.csv")
    assert [row["step"] for row in curve] == [1, 2, 3, 4]
    shown = [float(line.split("loss ")[1].split()[0]) for line in (first.stdout + resumed.stdout).splitlines()
             if line.startswith("step ") and "loss " in line]
    assert [round(row["loss"], 3) for row in curve] == shown
    assert all(row["learning_rate"] > 0 and row["target_tokens_per_second"] > 0 for row in curve)
    history = kt_training.read_history(model_dir / "history.jsonl")
    assert [record["step"] for record in history] == [2, 4]
    assert all(record["val_loss"] > 0 and "val_chrf" in record for record in history)
    assert all(record["chrf_signature"].startswith("nrefs:1|") for record in history)

    # TensorBoard's events, one file a run, as tensorboard's own reader reads them.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(list((model_dir / "logs").glob("events.out.tfevents.*"))) == 2
    board = EventAccumulator(str(model_dir / "logs"))
    board.Reload()
    scalars = lambda tag, digits=3: [(e.step, round(e.value, digits)) for e in board.Scalars(tag)]  # noqa: E731
    assert scalars("train/loss") == [(row["step"], round(row["loss"], 3)) for row in curve]
    assert [step for step, _ in scalars("train/learning_rate")] == [1, 2, 3, 4]
    assert [step for step, _ in scalars("train/tokens_per_second")] == [1, 2, 3, 4]
    assert [step for step, _ in scalars("train/gradient_norm")] == [1, 2, 3, 4]
    assert all(value > 0 for _, value in scalars("train/gradient_norm"))
    assert "train/interval_gradient_norm" not in board.Tags()["scalars"]  # the last update's, no interval's mean
    assert scalars("valid/loss") == [(r["step"], round(r["val_loss"], 3)) for r in history]
    assert scalars("valid/chrf", 2) == [(r["step"], r["val_chrf"]) for r in history]  # the history's 2 digits
    texts = board.Tensors("valid/translations")
    assert [event.step for event in texts] == [2, 4]
    assert texts[-1].tensor_proto.string_val[0].decode().startswith("| source | translation | reference |")


@slow  # needs `trained`, two training runs
def test_translate_evaluate_and_plot_without_tensorflow(trained):
    directory, _, results = trained
    translated, evaluated, plotted = results["translated"], results["evaluated"], results["plotted"]
    assert translated.returncode == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == len(builtin_corpus("test", size=3).sources)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "BLEU" in evaluated.stdout and "chrF" in evaluated.stdout
    assert plotted.returncode == 0, plotted.stderr
    assert (directory / "attention.png").read_bytes()[:4] == b"\x89PNG"


@slow  # needs `trained`, two training runs
def test_export_says_what_to_install(trained):
    exported = trained[2]["exported"]
    assert exported.returncode == 1
    assert exported.stderr.strip().splitlines() == [exported.stderr.strip().splitlines()[-1]]
    assert exported.stderr.startswith("error: export writes a TensorFlow SavedModel")
    assert 'pip install "keras-vaswani[export]"' in exported.stderr


def test_the_tensorflow_backend_names_its_extra_when_tensorflow_is_missing(tmp_path):
    environment = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=HOOK)
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "--version"],
        capture_output=True, text=True, env=environment, timeout=120,
    )
    assert result.returncode == 2  # as for an unknown backend (test_environment)
    assert result.stderr.strip().startswith("error: KERAS_BACKEND=tensorflow needs the 'tensorflow' package")
    assert 'pip install "keras-vaswani[tensorflow]"' in result.stderr
