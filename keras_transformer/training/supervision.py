"""One process of a run of several: when another process is lost, it ends
with one line that says so, and how to resume.

When a process of a `jax.distributed` run dies, the others wait in their
next collective until JAX's coordination service misses its heartbeats
(100 s), and the service then ends them from C++: a fatal log line and an
abort, which Python cannot catch. So `keras-transformer train`, as one of
several JAX processes (`JAX_COORDINATOR_ADDRESS` set), trains in a child
process and passes its output through. If the child ends that way, the
parent prints one `error:` line (the lost processes, the newest checkpoint
here, the command that resumes) and exits with status 1; the child's
lines from the fatal one on are shown with `--verbose` only. A collective
that fails in Python instead ("Connection closed by peer") ends the child
the same way, with one `error:` line of its own (`lost_process_error`).

TensorFlow's workers need no parent: when one stops sending heartbeats
(about 10 s), TensorFlow's coordination service aborts the others'
collectives with an error that Python sees, which each worker turns into
the same line. Tracebacks are for `--verbose`.
"""

import os
import re
import signal
import subprocess
import sys
import traceback

from keras_transformer.training.checkpoints import checkpoint_step
from keras_transformer.training.checkpoints import list_checkpoints
from keras_transformer.training.distribution import _tensorflow_cluster

# Set in the child's environment: it trains, and is not supervised again.
CHILD = "KERAS_TRANSFORMER_SUPERVISED_CHILD"
# The coordination service's fatal line, and the tasks it names after it.
FATAL = re.compile(rb"Terminating process because the JAX distributed service detected fatal errors")
# The lines the coordination service's error logs span (their first line
# is one of the C++ log lines the command filters out): the lost tasks'
# numbers, and the text and RPC name after them.
SERVICE_LINES = re.compile(rb"^\s*$|^[\d,\s]+$|^The tasks have crashed|^RPC: /xla\.coordination|.*CoordinationServiceError")
TASKS = re.compile(rb"[\d,\s]+")


def train(config, resume, log):
    """`run.train_translator(config, resume, log)`, in a watched child
    process where this is one of several JAX processes (`needed`)."""
    from keras_transformer.environment import verbose_requested
    from keras_transformer.training.run import train_translator

    if needed():
        raise SystemExit(run_child(sys.argv[1:], config.model_dir, verbose=verbose_requested()))
    if os.environ.get(CHILD):
        _end_with_parent()
    try:
        return train_translator(config, resume=resume, log=log)
    except Exception as error:
        several = os.environ.get(CHILD) or len(_tensorflow_cluster().get("worker", [])) > 1
        loss = lost_process_error(error) if several else None
        if loss is None:
            raise
        from keras_transformer.environment import stop_filtering_stderr

        stop_filtering_stderr()
        if verbose_requested():
            traceback.print_exc()
        lost, cause = loss
        print(f"error: {describe_loss(lost, config.model_dir, cause)}", file=sys.stderr, flush=True)
        os._exit(1)  # not Python's exit: the backend's shutdown would wait for the lost process


def _end_with_parent():
    """On Linux, the kernel ends this child when its parent ends (a parent
    killed with -9 forwards nothing); elsewhere the child's next write to
    the parent's closed pipe ends it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def needed():
    """Whether this `train` command is one of several JAX processes, not yet
    under a parent that watches it."""
    from keras_transformer.environment import running_as_command
    from keras_transformer.environment import selected_backend

    return (
        running_as_command()
        and selected_backend() == "jax"
        and bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
        and not os.environ.get(CHILD)
    )


def run_child(arguments, model_dir, verbose=False):
    """Runs `keras-transformer *arguments` in a child process, forwarding its
    output and the signals this process receives; returns the exit status to
    end with."""
    child = subprocess.Popen(
        [sys.executable, "-m", "keras_transformer", *arguments],
        env=dict(os.environ, **{CHILD: "1"}),
        stderr=subprocess.PIPE,
    )
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda received, frame: child.send_signal(received))
    fatal, held, lost = False, [], set()
    for line in child.stderr:
        if FATAL.search(line):
            fatal = True
        if fatal or SERVICE_LINES.match(line):
            # The service's lines around its fatal one: held until it is known
            # whether the fatal one follows, and then shown with --verbose only.
            held.append(line)
            continue
        _write(held + [line])
        held = []
    if fatal:
        lost = {int(task) for line in held if TASKS.fullmatch(line.strip()) for task in re.findall(rb"\d+", line)}
    if held and (verbose or not fatal):
        _write(held)
    status = child.wait()
    if status == 0 or not fatal:
        return 1 if status < 0 else status
    print(f"error: {describe_loss(sorted(lost), model_dir)}", file=sys.stderr, flush=True)
    return 1


def _write(lines):
    sys.stderr.buffer.write(b"".join(lines))
    sys.stderr.buffer.flush()


def describe_loss(lost, model_dir, cause=None):
    """What ended a run of several processes, and how to resume it."""
    who = (
        f"process{'es' * (len(lost) > 1)} {', '.join(map(str, lost))} stopped answering"
        if lost else "another process stopped answering"
    )
    if cause:
        who += f" ({cause})"
    checkpoints = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    newest = f"this process's newest checkpoint is at step {checkpoint_step(checkpoints[-1])}" if checkpoints else (
        "this process has no checkpoint yet"
    )
    return (
        f"training stopped: {who}; {newest}. Start every process again with --resume "
        f"(keras-transformer train --resume --model-dir {model_dir}) to resume together "
        "from the newest checkpoint all of them have."
    )


def lost_process_error(error):
    """`(lost, cause)` if `error`, or the error it was raised from, is a
    collective that failed because another process is gone (raised by JAX
    or TensorFlow, or passed on by Keras as another type): the lost
    processes' numbers where the error names them, and the error's first
    line where it does not; else None."""
    while error is not None:
        text = str(error).strip()
        unhealthy = re.search(r"tasks are unhealthy[^:]*:\s*((?:/job:worker/replica:\d+/task:\d+\s*)+)", text)
        if unhealthy:
            return sorted({int(task) for task in re.findall(r"task:(\d+)", unhealthy.group(1))}), None
        if re.search(r"Connection closed by peer|Gloo \w+ failed", text):
            return [], text.splitlines()[0][:200]
        error = error.__cause__ or error.__context__
    return None
