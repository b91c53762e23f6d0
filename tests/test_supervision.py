"""The one line a run of several processes ends with when another is lost
(keras_transformer/training/supervision.py). The runs themselves, killed
and resumed, are the slow tier's (test_distribution_*.py)."""

import signal
import sys
import time

import pytest
from conftest import in_one_pass

from keras_transformer.training import supervision

pytestmark = in_one_pass("jax", "error text and file names, the same under every backend")


def test_the_line_names_the_lost_processes_the_newest_checkpoint_and_the_resume_command(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    assert "this process has no checkpoint yet" in supervision.describe_loss([], tmp_path)
    for step in (4, 12):
        (tmp_path / "checkpoints" / f"ckpt-{step:08d}.keras").write_bytes(b"")
    line = supervision.describe_loss([1, 2], tmp_path, cause="Gloo allreduce failed")
    assert line.startswith("training stopped: processes 1, 2 stopped answering (Gloo allreduce failed); ")
    assert "this process's newest checkpoint is at step 12" in line
    assert f"keras-transformer train --resume --model-dir {tmp_path}" in line


def test_a_collective_failed_by_a_lost_process_is_told_by_the_engines_error_types_and_codes():
    import jax
    import tensorflow as tf

    unhealthy = tf.errors.UnavailableError(None, None, (
        "Collective ops is aborted by: The following tasks are unhealthy (stopped sending heartbeats):\n"
        "/job:worker/replica:0/task:1\n/job:worker/replica:0/task:3\nThe tasks have crashed."
    ))
    try:
        raise ValueError("Keras's own error") from unhealthy
    except ValueError as error:
        assert supervision.lost_process_error(error) == ([1, 3], None)
    # Worded as no release words it: the type and the status code decide.
    reworded = jax.errors.JaxRuntimeError("UNAVAILABLE: a peer went away in some new words\nmore lines")
    assert supervision.lost_process_error(reworded) == ([], "UNAVAILABLE: a peer went away in some new words")
    assert supervision.lost_process_error(tf.errors.DeadlineExceededError(None, None, "timed out")) == (
        [], "timed out")
    # A failed collective of JAX's CPU runs reaches Python as a ValueError of its status.
    gloo = ValueError("UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error: Connection reset by peer")
    assert supervision.lost_process_error(gloo) == ([], str(gloo))
    for other in (jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory"), RuntimeError("UNAVAILABLE: mine"), ValueError("no status code"),
                  tf.errors.InvalidArgumentError(None, None, "bad shape")):
        assert supervision.lost_process_error(other) is None


def child(*lines, status=0, once=None):
    """A child program for `run_child`: it writes `lines` to stderr and its
    arguments to `once` (a file), and exits with `status`; with `once`, only
    the first time (then 0). A negative status is that signal."""
    script = (
        "import os, signal, sys\n"
        f"once = {str(once)!r} if {once is not None} else None\n"
        "again = once is not None and os.path.exists(once)\n"
        "if once is not None:\n"
        "    open(once, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"sys.stderr.write({''.join(line + chr(10) for line in lines)!r} * (not again)); sys.stderr.flush()\n"
        f"status = 0 if again else {status}\n"
        "os.kill(os.getpid(), -status) if status < 0 else sys.exit(status)\n"
    )
    return [sys.executable, "-c", script]


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_an_abort_with_a_made_up_fatal_message_ends_with_one_error_line_and_the_lost_status(tmp_path, capfd):
    made_up = "F1205 10:00:00.000000 1 some_new_service.cc:42] A wording no release of JAX has used yet"
    status = supervision.run_child(["train", "--model-dir", str(tmp_path)], tmp_path,
                                   program=child(made_up, status=-signal.SIGABRT))
    err = capfd.readouterr().err
    assert status == supervision.LOST_STATUS == 75
    assert len(error_lines(err)) == 1 and error_lines(err)[0].startswith("error: training stopped: another process"), err
    assert made_up in err  # not the service's known lines: passed through


def test_the_child_s_own_error_line_is_passed_on_once_and_other_failures_keep_their_status(tmp_path, capfd):
    own = "error: training stopped: process 1 stopped answering; ..."
    assert supervision.run_child([], tmp_path, program=child(own, status=75)) == 75
    assert error_lines(capfd.readouterr().err) == [own]
    mistake = "error: --train-steps must be an integer >= 1; received 0."
    assert supervision.run_child([], tmp_path, max_restarts=3, program=child(mistake, status=1)) == 1
    assert error_lines(capfd.readouterr().err) == [mistake]  # a mistake is not restarted


@pytest.mark.parametrize("status", [75, -signal.SIGKILL])
def test_a_lost_process_restarts_the_child_with_resume_and_one_line_from_the_newest_step(
        tmp_path, capfd, monkeypatch, status):
    # A child killed itself waits for the heartbeat timeout (and a margin, 0 here) before it starts again.
    monkeypatch.setattr(supervision, "RESTART_MARGIN", 0)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-00000008.keras").write_bytes(b"")
    calls = tmp_path / "calls.txt"
    program = child("error: training stopped: process 1 stopped answering", status=status, once=calls)
    started = time.monotonic()
    assert supervision.run_child(["train", "--model-dir", str(tmp_path)], tmp_path, max_restarts=1,
                                 program=program, heartbeat_timeout=2) == 0
    waited = time.monotonic() - started
    assert calls.read_text().splitlines() == [f"train --model-dir {tmp_path}", f"train --model-dir {tmp_path} --resume"]
    err = capfd.readouterr().err
    assert error_lines(err) == [] and err.count("restart 1 of 1") == 1 and "resuming from step 8" in err, err
    assert ("in 2 s" in err and waited >= 2) if status < 0 else ("in 2 s" not in err), err
    # Out of restarts: the lost status, and the line.
    calls.unlink()
    always = child("error: training stopped: process 1 stopped answering", status=status)
    assert supervision.run_child(["train"], tmp_path, max_restarts=0, program=always) == 75
    assert len(error_lines(capfd.readouterr().err)) == 1
