"""TensorFlow workers on 127.0.0.1, as on several machines: two
`keras-transformer train` processes of one `MultiWorkerMirroredStrategy` run
(TF_CONFIG), one of them lost mid-run. (The workers' training to identical
weights, and their agreeing on a step, are in test_training.py.)"""

import json
import os

import keras
import pytest
from process_runs import corpus  # noqa: F401 (a fixture)
from process_runs import kill_one_then_resume_both
from process_runs import shared_directory_run
from process_runs import uninterrupted

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy is the TensorFlow backend's engine; runs in the TensorFlow pass",
)


def workers_of_one_run(ports, index):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return dict(
        os.environ, KERAS_BACKEND="tensorflow",
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
    )


@pytest.fixture(scope="module")
def whole(corpus, tmp_path_factory):
    return uninterrupted(corpus, tmp_path_factory.mktemp("whole"), workers_of_one_run)


def test_a_lost_worker_ends_the_other_with_one_error_line_and_both_resume_to_the_uninterrupted_weights(
    corpus, tmp_path, whole
):
    # TensorFlow's coordination service declares a worker lost after 10 s without heartbeats.
    kill_one_then_resume_both(corpus, tmp_path, workers_of_one_run, within=60, whole=whole)


def test_two_workers_train_into_one_shared_directory_as_into_one_each(corpus, whole, tmp_path):
    shared_directory_run(corpus, tmp_path, workers_of_one_run, whole)
