"""One process of a run of several: when another process is lost, it ends
with one line that says so, and how to resume.

When a process of a `jax.distributed` run dies, the others wait in their
next collective until JAX's coordination service misses its heartbeats
(100 s), and the service then ends them from C++: a fatal log line and an
abort, which Python cannot catch. So `keras-transformer train`, as one of
several JAX processes (`JAX_COORDINATOR_ADDRESS` set), trains in a child
process and passes its output through. If the child ends that way, the
parent prints one `error:` line (the lost processes, the newest checkpoint
here, the command that resumes) and exits with status `LOST_STATUS`; the child's
lines from the fatal one on are shown with `--verbose` only. A collective
that fails in Python instead ("Connection closed by peer") ends the child
the same way, with one `error:` line of its own (`lost_process_error`).

TensorFlow's workers need no parent: when one stops sending heartbeats
(about 10 s), TensorFlow's coordination service aborts the others'
collectives with an error that Python sees, which each worker turns into
the same line. Tracebacks are for `--verbose`.

A loss is told by the engines' own signs, not by the words of their logs:
the child's abort (a signal) or its exit status `LOST_STATUS`, and an error
of the engine's type and status code (`lost_process_error`). The log lines
only name the processes lost. Every process of the run then exits with
`LOST_STATUS`, for a scheduler to requeue the job on; under the parent,
`--max-restarts N` starts the child again with `--resume` up to N times
instead, so that the group re-forms through the coordinator.
"""

import os
import re
import signal
import subprocess
import sys
import time
import traceback

from keras_transformer.training.checkpoints import checkpoint_step
from keras_transformer.training.checkpoints import list_checkpoints
from keras_transformer.training.distribution import tensorflow_workers

# The exit status of a process whose run lost another process: resuming
# continues it (sysexits' EX_TEMPFAIL, "try again"). Schedulers requeue on it.
LOST_STATUS = 75
# The engines' status codes of a collective that a lost peer ended (JAX's
# CPU collectives, Gloo, give a reset connection UNKNOWN).
LOST_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "CANCELLED", "UNKNOWN")
# jax.distributed's heartbeat timeout by default, in seconds; and the time,
# past it, that a restart of a child lost itself waits for the others'.
HEARTBEAT_TIMEOUT = 100
RESTART_MARGIN = 5

# Set in the child's environment: it trains, and is not supervised again.
CHILD = "KERAS_TRANSFORMER_SUPERVISED_CHILD"
# The coordination service's fatal line, and the tasks it names after it.
FATAL = re.compile(rb"Terminating process because the JAX distributed service detected fatal errors")
# The lines the coordination service's error logs span (their first line
# is one of the C++ log lines the command filters out): the lost tasks'
# numbers, and the text and RPC name after them.
SERVICE_LINES = re.compile(rb"^\s*$|^[\d,\s]+$|^The tasks have crashed|^RPC: /xla\.coordination|.*CoordinationServiceError")
TASKS = re.compile(rb"[\d,\s]+")


def train(config, resume, log, max_restarts=0, heartbeat_timeout=None):
    """`run.train_translator(config, resume, log)`, in a watched child
    process where this is one of several JAX processes (`needed`), which
    restarts it with `--resume` up to `max_restarts` times when a process
    is lost. `heartbeat_timeout`: seconds without a heartbeat after which
    the engine declares a process lost (`Distribution`)."""
    from keras_transformer.environment import verbose_requested
    from keras_transformer.training.run import train_translator

    if needed():
        raise SystemExit(run_child(sys.argv[1:], config.model_dir, verbose_requested(), max_restarts,
                                   heartbeat_timeout=heartbeat_timeout))
    if os.environ.get(CHILD):
        _end_with_parent()
    try:
        return train_translator(config, resume=resume, log=log, heartbeat_timeout=heartbeat_timeout)
    except Exception as error:
        several = os.environ.get(CHILD) or tensorflow_workers() > 1
        loss = lost_process_error(error) if several else None
        if loss is None:
            raise
        from keras_transformer.environment import stop_filtering_stderr

        stop_filtering_stderr()
        if verbose_requested():
            traceback.print_exc()
        lost, cause = loss
        print(f"error: {describe_loss(lost, config.model_dir, cause)}", file=sys.stderr, flush=True)
        os._exit(LOST_STATUS)  # not Python's exit: the backend's shutdown would wait for the lost process


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


def run_child(arguments, model_dir, verbose=False, max_restarts=0, program=None, heartbeat_timeout=None):
    """Runs `keras-transformer *arguments` (or `program + arguments`) in a
    child process, forwarding its output and the signals this process
    receives, and again with `--resume` up to `max_restarts` times when it
    ends by a lost process; returns the exit status to end with.

    A child that was itself lost (killed, crashed: a signal but the
    coordination service's abort) starts again once the others had
    `heartbeat_timeout` seconds (JAX's default where None) to notice and
    start theirs: a new child joins the group they form, not the old one."""
    program = program or [sys.executable, "-m", "keras_transformer"]
    for restart in range(max_restarts + 1):
        status, lost, errors, stopped = _watch([*program, *arguments], verbose)
        # An abort (the engine's fatal error), a kill, or the child's own
        # word that another process is lost; any other failure is the run's,
        # and a signal this process passed on is the user's.
        if status == 0 or stopped or not (status < 0 or status == LOST_STATUS):
            _write(errors)
            return 1 if status < 0 else status
        if restart == max_restarts:
            break
        wait = HEARTBEAT_TIMEOUT if heartbeat_timeout is None else heartbeat_timeout
        wait = wait + RESTART_MARGIN if status < 0 and status != -signal.SIGABRT else 0
        checkpoints = list_checkpoints(os.path.join(model_dir, "checkpoints"))
        step = checkpoint_step(checkpoints[-1]) if checkpoints else 0
        print(f"restart {restart + 1} of {max_restarts}: a process of the run was lost; resuming from step {step}, "
              "or the newest checkpoint every process has" + (f", in {wait} s" if wait else ""),
              file=sys.stderr, flush=True)
        time.sleep(wait)
        arguments = list(arguments) + ["--resume"] * ("--resume" not in arguments)
    _write(errors)
    if not errors:  # the child's own line says it where it could
        print(f"error: {describe_loss(sorted(lost), model_dir)}", file=sys.stderr, flush=True)
    return LOST_STATUS


def _watch(command, verbose):
    """Runs `command`, passing its output through but the coordination
    service's lines around a fatal one (`--verbose` shows them). Returns
    its exit status, the processes those lines name as lost, its `error:`
    lines (held back: a restart replaces them), and whether this process
    passed a signal on to it."""
    child = subprocess.Popen(command, env=dict(os.environ, **{CHILD: "1"}), stderr=subprocess.PIPE)
    stopped = []
    handlers = {number: signal.signal(number, lambda received, frame: stopped.append(received) or child.send_signal(
        received)) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        status, lost, errors = _pass_through(child, verbose)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return status, lost, errors, bool(stopped)


def _pass_through(child, verbose):
    fatal, held, errors = False, [], []
    for line in child.stderr:
        if FATAL.search(line):
            fatal = True
        if fatal or SERVICE_LINES.match(line):
            # The service's lines around its fatal one: held until it is known
            # whether the fatal one follows, and then shown with --verbose only.
            held.append(line)
            continue
        if line.startswith(b"error: "):
            errors.append(line)
            continue
        _write(held + [line])
        held = []
    lost = {int(task) for line in held if TASKS.fullmatch(line.strip()) for task in re.findall(rb"\d+", line)}
    status = child.wait()
    if held and (verbose or not fatal):
        _write(held)
    return status, lost if fatal else set(), errors


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
    """`(lost, cause)` if `error`, or an error it was raised from, is the
    engine's own error of a collective that a lost process ended (raised by
    JAX or TensorFlow, or passed on by Keras as another type): a
    TensorFlow `UnavailableError`, `AbortedError`, `DeadlineExceededError`
    or `CancelledError`, or JAX's `JaxRuntimeError` or `ValueError` of a
    status code among `LOST_CODES`. `lost`: the processes the error names; `cause`: its first
    line where it names none. None for any other error."""
    while error is not None:
        if _engine_loss(error):
            text = str(error).strip()
            unhealthy = re.search(r"tasks are unhealthy[^:]*:\s*((?:/job:worker/replica:\d+/task:\d+\s*)+)", text)
            if unhealthy:
                return sorted({int(task) for task in re.findall(r"task:(\d+)", unhealthy.group(1))}), None
            return [], text.splitlines()[0][:200] if text else type(error).__name__
        error = error.__cause__ or error.__context__
    return None


def _engine_loss(error):
    """Whether `error` is one of the engines' errors of a lost peer. (An
    engine that is not imported raised nothing.)"""
    tf, jax = sys.modules.get("tensorflow"), sys.modules.get("jax")
    if tf is not None and isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError,
                                             tf.errors.DeadlineExceededError, tf.errors.CancelledError)):
        return True
    # JAX raises a computation's failed status as `JaxRuntimeError`, or (a
    # failed collective's, through jaxlib) as `ValueError`: its text starts
    # with the status code.
    code = re.match(r"([A-Z_]+): ", str(error).lstrip())
    return (jax is not None and isinstance(error, (jax.errors.JaxRuntimeError, ValueError))
            and code is not None and code.group(1) in LOST_CODES)
