"""The one line a run of several processes ends with when another is lost
(keras_transformer/training/supervision.py). The runs themselves, killed
and resumed, are the slow tier's (test_distribution_*.py)."""

from conftest import in_one_pass

from keras_transformer.training import supervision

pytestmark = in_one_pass("jax", "error text and file names, the same under every backend")


def test_a_collective_failed_by_a_lost_process_names_it_through_the_errors_it_was_raised_from():
    unhealthy = RuntimeError(
        "Collective ops is aborted by: The following tasks are unhealthy (stopped sending heartbeats):\n"
        "/job:worker/replica:0/task:1\n/job:worker/replica:0/task:3\nThe tasks have crashed."
    )
    try:
        raise ValueError("Keras's own error") from unhealthy
    except ValueError as error:
        assert supervision.lost_process_error(error) == ([1, 3], None)
    closed = RuntimeError("UNAVAILABLE: Connection closed by peer\nmore lines")
    assert supervision.lost_process_error(closed) == ([], "UNAVAILABLE: Connection closed by peer")
    assert supervision.lost_process_error(RuntimeError("out of memory")) is None


def test_the_line_names_the_lost_processes_the_newest_checkpoint_and_the_resume_command(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    assert "this process has no checkpoint yet" in supervision.describe_loss([], tmp_path)
    for step in (4, 12):
        (tmp_path / "checkpoints" / f"ckpt-{step:08d}.keras").write_bytes(b"")
    line = supervision.describe_loss([1, 2], tmp_path, cause="Gloo allreduce failed")
    assert line.startswith("training stopped: processes 1, 2 stopped answering (Gloo allreduce failed); ")
    assert "this process's newest checkpoint is at step 12" in line
    assert f"keras-transformer train --resume --model-dir {tmp_path}" in line
