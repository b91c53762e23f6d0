"""Data parallelism over several JAX processes, as on several machines.

Two `keras-transformer train` processes on 127.0.0.1, joined by
`jax.distributed` (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID), train one model, each feeding its own half of every global
batch. They end with identical weights and optimizer state, and log the
losses of one process training on the whole batches. Like the two TensorFlow
workers of test_distribution_tensorflow.py, each writes its own model
directory.
"""

import json
import os
import subprocess

import keras
import numpy as np
import pytest
from process_runs import STEPS
from process_runs import assert_same_checkpoints
from process_runs import corpus  # noqa: F401 (a fixture)
from process_runs import kill_one_then_resume_both
from process_runs import start_two
from process_runs import train
from process_runs import wait_for_all

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="jax.distributed across processes is the JAX backend's engine; runs in the JAX pass",
)


def environment(**extra):
    return dict(os.environ, KERAS_BACKEND="jax", **extra)


def processes_of_one_run(ports, index):
    port = ports[0]
    return environment(
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}",  # not every interface
        JAX_NUM_PROCESSES="2",
        JAX_PROCESS_ID=str(index),
    )


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
    processes = start_two(corpus, tmp_path, "process", processes_of_one_run)
    wait_for_all(processes, timeout=300)
    logs = [(tmp_path / f"process{i}.out", tmp_path / f"process{i}.err") for i in range(2)]
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


def test_processes_whose_newest_checkpoints_differ_resume_together_from_the_one_they_share(corpus, tmp_path):
    """As after a crash in which one process wrote its last checkpoint and
    the other did not: both resume from the newest step both have, the one
    ahead sets its newer checkpoint aside, and the run ends with the weights
    of an uninterrupted one."""
    whole = start_two(corpus, tmp_path, "whole", processes_of_one_run, "--train-steps", 8, "--valid-bleu-sentences", 0)
    first = start_two(corpus, tmp_path, "first", processes_of_one_run, "--train-steps", 6, "--valid-bleu-sentences", 0)
    for processes, name in ((whole, "whole"), (first, "first")):
        wait_for_all(processes, timeout=300)
        assert [p.returncode for p in processes] == [0, 0], (tmp_path / f"{name}0.err").read_text()[-3000:]
    (tmp_path / "first1" / "checkpoints" / "ckpt-00000006.keras").unlink()

    resumed = start_two(
        corpus, tmp_path, "resumed", processes_of_one_run, "--train-steps", 8, "--valid-bleu-sentences", 0, "--resume",
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
        assert_same_checkpoints(
            tmp_path / f"first{i}" / "checkpoints" / "ckpt-00000008.keras",
            tmp_path / f"whole{i}" / "checkpoints" / "ckpt-00000008.keras",
        )


def test_a_lost_process_ends_the_other_with_one_error_line_and_both_resume_to_the_uninterrupted_weights(
    corpus, tmp_path
):
    # JAX's coordination service gives up on a process after 100 s without heartbeats.
    kill_one_then_resume_both(corpus, tmp_path, processes_of_one_run, within=150)
