"""Data parallelism over several JAX processes, as on several machines.

Two `keras-transformer train` processes on 127.0.0.1, joined by
`jax.distributed` (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID), train one model, each feeding its own half of every global
batch. They end with identical weights and optimizer state, and log the
losses of one process training on the whole batches. Like the two TensorFlow
workers of test_training.py, each writes its own model directory.
"""

import contextlib
import json
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


pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="jax.distributed across processes is the JAX backend's engine; runs in the JAX pass",
)

STEPS = 4


def command(*args):
    return [sys.executable, "-m", "keras_transformer", *map(str, args)]


def environment(**extra):
    return dict(os.environ, KERAS_BACKEND="jax", **extra)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A toy task (reverse six words), prepared once for every process:
    with a 320-piece vocabulary every word is one piece."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(2, 5))) for _ in range(20)]
    directory = tmp_path_factory.mktemp("corpus")
    for split, size in (("train", 300), ("valid", 12)):
        sources = [" ".join(rng.choice(words, 6)) for _ in range(size)]
        targets = [" ".join(reversed(source.split())) for source in sources]
        for side, lines in (("en", sources), ("de", targets)):
            (directory / f"{split}.{side}").write_text("".join(line + "\n" for line in lines))
    prepared = subprocess.run(
        command("prepare", "--source", directory / "train.en", "--target", directory / "train.de",
                "--output", directory / "prepared", "--vocabulary-size", 320),
        env=environment(), capture_output=True, text=True, timeout=300,
    )
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    return directory


def train(corpus, model_dir):
    return command(
        "train", "--train-data", corpus / "prepared",
        "--valid-source", corpus / "valid.en", "--valid-target", corpus / "valid.de",
        "--model-dir", model_dir, "--preset", "tiny", "--num-layers", 1,
        "--tokens-per-batch", 512, "--max-tokens", 16, "--warmup-steps", 20,
        "--train-steps", STEPS, "--checkpoint-every", 2, "--average", 2,
        "--valid-bleu-sentences", 2, "--beam-size", 1,
    )


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


def final_state(model_dir):
    """The last checkpoint's weights and optimizer variables, and the saved
    translator's (averaged) weights."""
    checkpoint = keras.saving.load_model(model_dir / "checkpoints" / f"ckpt-{STEPS:08d}.keras")
    translator = keras.saving.load_model(model_dir / "model.keras")
    return {
        "step": int(keras.ops.convert_to_numpy(checkpoint.optimizer.iterations)),
        "weights": checkpoint.get_weights(),
        "optimizer": [keras.ops.convert_to_numpy(v) for v in checkpoint.optimizer.variables],
        "translator": translator.get_weights(),
        "paths": [v.path for v in checkpoint.weights],
    }


def losses(model_dir):
    with open(model_dir / "history.jsonl") as file:
        return [(r["step"], r["loss"], r["val_loss"]) for r in map(json.loads, file)]


def test_two_processes_on_localhost_train_one_model_to_identical_weights(corpus, tmp_path):
    port = free_port()
    processes, logs = [], []
    for i in range(2):
        # Files, not pipes: a full pipe would stall one process, and with it the other.
        logs.append((tmp_path / f"process{i}.out", tmp_path / f"process{i}.err"))
        with open(logs[i][0], "w") as out, open(logs[i][1], "w") as err:
            processes.append(subprocess.Popen(
                train(corpus, tmp_path / f"process{i}"),
                env=environment(
                    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                    JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}",  # not every interface
                    JAX_NUM_PROCESSES="2",
                    JAX_PROCESS_ID=str(i),
                ),
                stdout=out, stderr=err,
            ))
    wait_for_all(processes, timeout=300)
    for i, (process, (out, err)) in enumerate(zip(processes, logs)):
        assert process.returncode == 0, f"process {i} ({process.returncode}):\n{err.read_text()[-3000:]}"
        assert "Distribution(jax, DataParallel, replicas=2, processes=2)" in out.read_text()

    first, second = final_state(tmp_path / "process0"), final_state(tmp_path / "process1")
    assert first["step"] == second["step"] == STEPS
    for key in ("weights", "optimizer", "translator"):
        for a, b in zip(first[key], second[key], strict=True):
            np.testing.assert_array_equal(a, b)
    # They trained: every layer normalization left its initial gamma 1, beta 0.
    norms = [(p, w) for p, w in zip(first["paths"], first["weights"]) if p.endswith(("/gamma", "/beta"))]
    assert len(norms) == 10
    for path, weight in norms:
        assert not np.allclose(weight, 1.0 if path.endswith("gamma") else 0.0, atol=1e-4), path

    # The two halves make the global batch: one process training on it
    # alone logs the same losses.
    alone = subprocess.run(
        train(corpus, tmp_path / "alone"), env=environment(), capture_output=True, text=True, timeout=300
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "Distribution(jax, single device, replicas=1)" in alone.stdout
    together, single = losses(tmp_path / "process0"), losses(tmp_path / "alone")
    assert [step for step, *_ in together] == [step for step, *_ in single] == [2, 4]
    np.testing.assert_allclose(together, single, rtol=1e-4)


def start_two(corpus, tmp_path, name, *extra, model_dirs=None):
    """Two processes of one run, each logging to files, each in a process
    group of its own (the command trains in a child of the process started)."""
    port = free_port()
    processes = []
    for i in range(2):
        model_dir = model_dirs[i] if model_dirs else tmp_path / f"{name}{i}"
        with open(tmp_path / f"{name}{i}.out", "w") as out, open(tmp_path / f"{name}{i}.err", "w") as err:
            processes.append(subprocess.Popen(
                train(corpus, model_dir) + [str(a) for a in extra],
                env=environment(
                    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}",
                    JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i),
                ),
                stdout=out, stderr=err, start_new_session=True,
            ))
    return processes


def test_processes_whose_newest_checkpoints_differ_resume_together_from_the_one_they_share(corpus, tmp_path):
    """As after a crash in which one process wrote its last checkpoint and
    the other did not: both resume from the newest step both have, the one
    ahead sets its newer checkpoint aside, and the run ends with the weights
    of an uninterrupted one."""
    whole = start_two(corpus, tmp_path, "whole", "--train-steps", 8, "--valid-bleu-sentences", 0)
    first = start_two(corpus, tmp_path, "first", "--train-steps", 6, "--valid-bleu-sentences", 0)
    for processes, name in ((whole, "whole"), (first, "first")):
        wait_for_all(processes, timeout=300)
        assert [p.returncode for p in processes] == [0, 0], (tmp_path / f"{name}0.err").read_text()[-3000:]
    (tmp_path / "first1" / "checkpoints" / "ckpt-00000006.keras").unlink()

    resumed = start_two(
        corpus, tmp_path, "resumed", "--train-steps", 8, "--valid-bleu-sentences", 0, "--resume",
        model_dirs=[tmp_path / "first0", tmp_path / "first1"],
    )
    wait_for_all(resumed, timeout=300)
    assert [p.returncode for p in resumed] == [0, 0], (tmp_path / "resumed0.err").read_text()[-3000:]
    for i in range(2):
        out = (tmp_path / f"resumed{i}.out").read_text()
        assert "resuming from ckpt-00000004.keras: step 4 of 8\n" in out, out
    assert "the processes' newest common checkpoint is at step 4: set aside ckpt-00000006.keras" in (
        tmp_path / "resumed0.out"
    ).read_text()
    assert (tmp_path / "first0" / "checkpoints" / ".ahead-ckpt-00000006.keras").exists()
    for i in range(2):
        got = keras.saving.load_model(tmp_path / f"first{i}" / "checkpoints" / "ckpt-00000008.keras")
        want = keras.saving.load_model(tmp_path / f"whole{i}" / "checkpoints" / "ckpt-00000008.keras")
        for a, b in zip(got.get_weights() + got.optimizer.variables, want.get_weights() + want.optimizer.variables,
                        strict=True):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-5, atol=1e-6)


def test_a_lost_process_ends_the_other_with_one_error_line(corpus, tmp_path):
    processes = start_two(corpus, tmp_path, "lost", "--train-steps", 400, "--valid-bleu-sentences", 0)
    fourth = tmp_path / "lost1" / "checkpoints" / "ckpt-00000004.keras"
    deadline = time.time() + 300
    while not fourth.exists() and time.time() < deadline and processes[1].poll() is None:
        time.sleep(0.01)
    os.killpg(processes[1].pid, signal.SIGKILL)  # the machine gone: the command and its child
    lost_at = time.time()
    try:
        processes[0].wait(timeout=240)
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    # JAX's coordination service gives up on a process after 100 s without heartbeats.
    assert time.time() - lost_at < 150 and processes[0].returncode == 1
    err = (tmp_path / "lost0.err").read_text()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert "Traceback" not in err and "Terminating process" not in err, err[-3000:]
    assert re.search(r"training stopped: (process 1|another process) stopped answering.*newest checkpoint is at step \d+", errors[0])
    assert f"keras-transformer train --resume --model-dir {tmp_path / 'lost0'}" in errors[0]
