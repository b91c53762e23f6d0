"""TensorFlow workers on 127.0.0.1, as on several machines: two
`keras-transformer train` processes of one `MultiWorkerMirroredStrategy` run
(TF_CONFIG), with updates of 2 batches each accumulated across the workers'
replicas (keras_private.ReplicaAccumulation). They train one model to
identical weights, into one model directory as into one each, and resume
together when one of them is lost mid-run. (Their agreeing on a step is in
test_training.py.)"""

import json
import os

import keras
import numpy as np
import pytest
from conftest import slow
from process_runs import corpus  # noqa: F401 (a fixture)
from process_runs import final_state
from process_runs import kill_one_then_resume_both
from process_runs import shared_directory_run
from process_runs import uninterrupted

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy is the TensorFlow backend's engine; runs in the TensorFlow pass",
)

ACCUMULATE = ["--accumulate", 2]


def workers_of_one_run(ports, index):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return dict(
        os.environ, KERAS_BACKEND="tensorflow",
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
    )


@pytest.fixture(scope="module")
def whole(corpus, tmp_path_factory):
    return uninterrupted(corpus, tmp_path_factory.mktemp("whole"), workers_of_one_run, ACCUMULATE)


def test_a_lost_worker_ends_the_other_with_one_error_line_and_both_resume_to_the_uninterrupted_weights(
    corpus, tmp_path, whole
):
    # TensorFlow's coordination service declares a worker lost after 10 s without heartbeats.
    kill_one_then_resume_both(corpus, tmp_path, workers_of_one_run, within=60, whole=whole, extra=ACCUMULATE)


def test_two_workers_train_into_one_shared_directory_as_into_one_each(corpus, whole, tmp_path):
    shared_directory_run(corpus, tmp_path, workers_of_one_run, whole, extra=ACCUMULATE)


@slow  # needs `whole`
def test_two_workers_on_localhost_train_together_to_identical_weights(whole):
    for i in range(2):
        assert "Distribution(tensorflow, MultiWorkerMirroredStrategy, replicas=2)" in (
            whole / f"whole{i}.out"
        ).read_text()
    first, second = final_state(whole / "whole0"), final_state(whole / "whole1")
    assert first["step"] == second["step"] == 12
    # Keras's optimizer also counts the batches: 2 an update.
    assert [int(v) for p, v in zip(first["optimizer_paths"], first["optimizer"]) if p.endswith("/iteration")] == [24]
    for key in ("weights", "optimizer", "translator"):
        for a, b in zip(first[key], second[key], strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
