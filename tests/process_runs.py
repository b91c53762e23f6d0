"""Two `keras-transformer train` processes of one run on 127.0.0.1, as on two
machines: the corpus they train on, their start, and the test of one of them
killed mid-run (test_distribution_jax.py, test_distribution_tensorflow.py)."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from conftest import write_reversal_files

STEPS = 4


def command(*args):
    return [sys.executable, "-m", "keras_transformer", *map(str, args)]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A toy task (reverse six words), prepared once for every process:
    with a 320-piece vocabulary every word is one piece."""
    from keras_transformer.cli import main

    directory = write_reversal_files(tmp_path_factory.mktemp("corpus"))
    # In this process: the `train` processes are under test, not `prepare` (a start-up saved).
    main(["prepare", "--source", str(directory / "train.en"), "--target", str(directory / "train.de"),
          "--output", str(directory / "prepared"), "--vocabulary-size", "320"])
    return directory


def train(corpus, model_dir):
    return command(*train_arguments(corpus, model_dir))


def train_arguments(corpus, model_dir):
    """`keras-transformer train`'s arguments for a run of STEPS steps on `corpus`."""
    return [
        "train", "--train-data", corpus / "prepared",
        "--valid-source", corpus / "valid.en", "--valid-target", corpus / "valid.de",
        "--model-dir", model_dir, "--preset", "tiny", "--num-layers", 1,
        "--tokens-per-batch", 512, "--max-tokens", 16, "--warmup-steps", 20,
        "--train-steps", STEPS, "--checkpoint-every", 2, "--average", 2,
        "--valid-bleu-sentences", 2, "--beam-size", 1,
    ]


def wait_for_all(processes, timeout):
    """Waits for processes that must all succeed; if one fails, the others
    (waiting for it in a collective) are stopped."""
    deadline = time.time() + timeout
    while any(p.poll() is None for p in processes):
        if any(p.returncode not in (None, 0) for p in processes) or time.time() > deadline:
            for p in processes:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    for p in processes:
        p.wait()


def start_two(corpus, tmp_path, name, environments, *extra, model_dirs=None):
    """Two processes of one run, process i in `environments(ports, i)`, each
    logging to files (a full pipe would stall one, and with it the other)
    and in a process group of its own (a JAX process trains in a child)."""
    ports = [free_port(), free_port()]
    processes = []
    for i in range(2):
        model_dir = model_dirs[i] if model_dirs else tmp_path / f"{name}{i}"
        with open(tmp_path / f"{name}{i}.out", "w") as out, open(tmp_path / f"{name}{i}.err", "w") as err:
            processes.append(subprocess.Popen(
                train(corpus, model_dir) + [str(a) for a in extra],
                env=environments(ports, i), stdout=out, stderr=err, start_new_session=True,
            ))
    return processes


def assert_same_checkpoints(got, want):
    got, want = keras.saving.load_model(got), keras.saving.load_model(want)
    for a, b in zip(got.get_weights() + got.optimizer.variables, want.get_weights() + want.optimizer.variables,
                    strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-5, atol=1e-6)


# The run the kill test's processes resume to: `uninterrupted(...)`.
RUN = ["--train-steps", 12, "--valid-bleu-sentences", 0]


def uninterrupted(corpus, directory, environments, extra=()):
    """Two processes' run of `RUN` (and `extra`), never interrupted: their
    model directories `directory / "whole0"` and `"whole1"`."""
    whole = start_two(corpus, directory, "whole", environments, *RUN, *extra)
    wait_for_all(whole, timeout=300)
    assert [p.returncode for p in whole] == [0, 0], (directory / "whole0.err").read_text()[-3000:]
    return directory


def final_state(model_dir):
    """The last checkpoint's weights and optimizer variables, and the saved
    translator's (averaged) weights."""
    checkpoint = keras.saving.load_model(model_dir / "checkpoints" / "ckpt-00000012.keras")
    translator = keras.saving.load_model(model_dir / "model.keras")
    return {
        "step": int(keras.ops.convert_to_numpy(checkpoint.optimizer.iterations)),
        "weights": checkpoint.get_weights(),
        "optimizer": [keras.ops.convert_to_numpy(v) for v in checkpoint.optimizer.variables],
        "optimizer_paths": [v.path for v in checkpoint.optimizer.variables],
        "translator": translator.get_weights(),
        "paths": [v.path for v in checkpoint.weights],
    }


def newest_step(model_dir):
    return max(int(path.stem.split("-")[1]) for path in (model_dir / "checkpoints").glob("ckpt-*.keras"))


def kill_one_then_resume_both(corpus, tmp_path, environments, within, whole, extra=()):
    """Process 1 (the command and its child, as when its machine is gone) is
    killed at a random step; process 0 must stop within `within` seconds
    with one `error:` line and no traceback. Then process 1's newest
    checkpoint goes, as when it was killed before writing it: both,
    started again with --resume, must agree on the newest step both have,
    and end with the weights of the run `whole` (`uninterrupted` with `extra`,
    the options the resumed processes read from their train_config.json)."""
    processes = start_two(corpus, tmp_path, "lost", environments, *RUN, *extra)
    started = time.time()
    kill_after = int(np.random.default_rng().choice([4, 6, 8]))
    written = tmp_path / "lost1" / "checkpoints" / f"ckpt-{kill_after:08d}.keras"
    deadline = time.time() + 300
    while not written.exists() and time.time() < deadline and processes[1].poll() is None:
        time.sleep(0.01)
    os.killpg(processes[1].pid, signal.SIGKILL)
    lost_at = time.time()
    try:
        processes[0].wait(timeout=within + 60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    err = (tmp_path / "lost0.err").read_text()
    stopped = time.time() - lost_at
    print(f"the survivor stopped {stopped:.1f} s after the kill")  # shown by pytest -s
    assert stopped < within and processes[0].returncode == 75, (kill_after, lost_at - started, stopped, err[-3000:])
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert "Traceback" not in err and "Terminating process" not in err, err[-3000:]
    assert re.search(
        r"training stopped: (process 1|another process) stopped answering.*newest checkpoint is at step \d+", errors[0]
    ), errors[0]
    assert f"keras-transformer train --resume --model-dir {tmp_path / 'lost0'}" in errors[0]

    (tmp_path / "lost1" / "checkpoints" / f"ckpt-{newest_step(tmp_path / 'lost1'):08d}.keras").unlink()
    common, ahead = newest_step(tmp_path / "lost1"), newest_step(tmp_path / "lost0")
    resumed = start_two(corpus, tmp_path, "resumed", environments, *RUN, "--resume",
                        model_dirs=[tmp_path / "lost0", tmp_path / "lost1"])
    wait_for_all(resumed, timeout=300)
    assert [p.returncode for p in resumed] == [0, 0], (tmp_path / "resumed0.err").read_text()[-3000:]
    for i in range(2):
        assert f"resuming from ckpt-{common:08d}.keras: step {common} of 12\n" in (tmp_path / f"resumed{i}.out").read_text()
    if ahead > common:  # process 0 wrote the checkpoint process 1 lost (it nearly always has)
        assert f"the processes' newest common checkpoint is at step {common}: set aside ckpt-{ahead:08d}.keras" in (
            tmp_path / "resumed0.out"
        ).read_text()
    for i in range(2):
        assert_same_checkpoints(
            tmp_path / f"lost{i}" / "checkpoints" / "ckpt-00000012.keras",
            whole / f"whole{i}" / "checkpoints" / "ckpt-00000012.keras",
        )


def shared_directory_run(corpus, tmp_path, environments, whole, extra=()):
    """Two processes of one run of `RUN` (and `extra`) pointed at one model
    directory: `assert_written_as_one_each`."""
    shared = tmp_path / "shared"
    processes = start_two(corpus, tmp_path, "shared", environments, *RUN, *extra, model_dirs=[shared, shared])
    wait_for_all(processes, timeout=300)
    assert [p.returncode for p in processes] == [0, 0], [(tmp_path / f"shared{i}.err").read_text()[-3000:] for i in range(2)]
    assert_written_as_one_each(tmp_path, "shared", shared, whole)


def assert_written_as_one_each(tmp_path, name, shared, whole):
    """The model directory `shared` of run `name`'s two processes: the first
    wrote it, the second read it, and it holds one vocabulary, one set of
    checkpoints and the translator, equal to the run `whole`
    (`uninterrupted`) whose processes wrote a directory each."""
    outs = [(tmp_path / f"{name}{i}.out").read_text() for i in range(2)]
    assert f"model directory: {shared}, shared by the run's 2 processes; this one writes it" in outs[0]
    assert "this one writes it" not in outs[1] and "the first process saved the translator" in outs[1]

    def files(directory):  # TensorBoard's event files are named by host, time and process
        return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and "logs" not in p.parts)

    assert files(shared) == files(whole / "whole0"), (files(shared), files(whole / "whole0"))
    for name in ("ckpt-00000010.keras", "ckpt-00000012.keras"):
        assert_same_checkpoints(shared / "checkpoints" / name, whole / "whole0" / "checkpoints" / name)
    for got, want in zip(keras.saving.load_model(shared / "model.keras").get_weights(),
                         keras.saving.load_model(whole / "whole0" / "model.keras").get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def children(pid):
    """The process ids of `pid`'s children (Linux)."""
    with open(f"/proc/{pid}/task/{pid}/children") as file:
        return [int(child) for child in file.read().split()]


def restart_after_a_lost_child(corpus, tmp_path, environments, whole, extra=()):
    """Process 1's training child, not its parent, is killed at a random
    checkpoint of a run with one model directory and `--max-restarts 1`:
    both parents start their children again with no person acting, and the
    directory ends as the run `whole` (`uninterrupted`) left its two
    (`assert_written_as_one_each`)."""
    shared = tmp_path / "restarted"
    processes = start_two(corpus, tmp_path, "restarted", environments, *RUN, "--max-restarts", 1, *extra,
                          model_dirs=[shared, shared])
    kill_after = int(np.random.default_rng().choice([4, 6, 8]))
    written = shared / "checkpoints" / f"ckpt-{kill_after:08d}.keras"
    deadline = time.time() + 300
    while not written.exists() and time.time() < deadline and processes[1].poll() is None:
        time.sleep(0.01)
    (child,) = children(processes[1].pid)
    os.kill(child, signal.SIGKILL)
    wait_for_all(processes, timeout=400)
    errs = [(tmp_path / f"restarted{i}.err").read_text() for i in range(2)]
    assert [p.returncode for p in processes] == [0, 0], (kill_after, errs[0][-3000:], errs[1][-3000:])
    restarts = [re.findall(r"restart 1 of 1: a process of the run was lost; resuming from step (\d+)", err) for err in errs]
    assert [len(found) for found in restarts] == [1, 1], errs
    assert int(restarts[1][0]) >= kill_after and not any("error:" in err for err in errs), errs
    assert_written_as_one_each(tmp_path, "restarted", shared, whole)


@contextlib.contextmanager
def serving(*args):
    """`keras-transformer serve *args` on a free port, in a process of its
    own, once it answers: yields `(process, url)`; the process is killed
    after, if it still runs."""
    import urllib.request

    port = free_port()
    process = subprocess.Popen(
        command("serve", "--port", port, *args), env=dict(os.environ, KERAS_BACKEND=keras.backend.backend()),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url + "health", timeout=5)
                break
            except OSError:
                assert time.time() < deadline and process.poll() is None, process.stderr.read()[-2000:]
                time.sleep(0.1)
        yield process, url
    finally:
        process.kill()
        process.wait()
