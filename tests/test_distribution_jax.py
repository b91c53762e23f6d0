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

import keras
import numpy as np
import pytest
from conftest import as_a_process
from conftest import slow
from process_runs import RUN
from process_runs import corpus  # noqa: F401 (a fixture)
from process_runs import final_state
from process_runs import kill_one_then_resume_both
from process_runs import restart_after_a_lost_child
from process_runs import train_arguments
from process_runs import uninterrupted

from keras_transformer.cli import main

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="jax.distributed across processes is the JAX backend's engine; runs in the JAX pass",
)


def processes_of_one_run(ports, index):
    port = ports[0]
    return dict(
        os.environ, KERAS_BACKEND="jax",
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}",  # not every interface
        JAX_NUM_PROCESSES="2",
        JAX_PROCESS_ID=str(index),
    )


def losses(model_dir):
    with open(model_dir / "history.jsonl") as file:
        return [(r["step"], r["loss"], r["val_loss"]) for r in map(json.loads, file)]


@pytest.fixture(scope="module")
def whole(corpus, tmp_path_factory):
    return uninterrupted(corpus, tmp_path_factory.mktemp("whole"), processes_of_one_run)


def test_two_processes_on_localhost_train_one_model_to_identical_weights(corpus, whole, tmp_path, capsys):
    for i in range(2):
        assert "Distribution(jax, DataParallel, replicas=2, processes=2)" in (whole / f"whole{i}.out").read_text()

    first, second = final_state(whole / "whole0"), final_state(whole / "whole1")
    assert first["step"] == second["step"] == 12
    for key in ("weights", "optimizer", "translator"):
        for a, b in zip(first[key], second[key], strict=True):
            np.testing.assert_array_equal(a, b)
    # They trained: every layer normalization left its initial gamma 1, beta 0.
    norms = [(p, w) for p, w in zip(first["paths"], first["weights"]) if p.endswith(("/gamma", "/beta"))]
    assert len(norms) == 10
    for path, weight in norms:
        assert not np.allclose(weight, 1.0 if path.endswith("gamma") else 0.0, atol=1e-4), path

    # The two halves make the global batch: one process training on it
    # alone (this one, on its one device) logs the same losses.
    arguments = [str(a) for a in train_arguments(corpus, tmp_path / "alone") + RUN]
    alone = as_a_process(capsys, lambda: main(arguments))
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "Distribution(jax, single device, replicas=1)" in alone.stdout
    together, single = losses(whole / "whole0"), losses(tmp_path / "alone")
    assert [step for step, *_ in together] == [step for step, *_ in single] == [2, 4, 6, 8, 10, 12]
    np.testing.assert_allclose(together, single, rtol=1e-4)


def test_a_lost_process_ends_the_other_with_one_error_line_and_both_resume_to_the_uninterrupted_weights(
    corpus, tmp_path, whole
):
    # JAX's coordination service gives up on a process after 100 s without
    # heartbeats by default; --heartbeat-timeout 20 must end the survivor within 40 s.
    kill_one_then_resume_both(corpus, tmp_path, processes_of_one_run, within=40, whole=whole,
                              extra=["--heartbeat-timeout", 20])


@slow  # needs `whole`
def test_two_processes_train_into_one_shared_directory_as_into_one_each_though_a_lost_child_restarts_on_both(
    corpus, whole, tmp_path
):
    # One run for both: the restarted run starts, writes and ends as a shared directory's run does.
    restart_after_a_lost_child(corpus, tmp_path, processes_of_one_run, whole, extra=["--heartbeat-timeout", 20])
