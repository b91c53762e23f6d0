"""Who writes a run's model directory.

One run at a time: a training run holds an advisory lock on
`model_dir/.run.lock` for as long as it trains, so that a second run
pointed at the same directory is refused before it writes anything,
rather than writing over the first's checkpoints. The lock is the
kernel's (`fcntl.flock`, which NFSv4 and Lustre pass on to the server):
it goes with the process that held it, killed or not, so a crash never
keeps the run's own `--resume` out. The file names the holder (host,
process id, start), for the refusal to say.

One writer: the processes of a run of several may each have a directory
of their own, or share the first process's (on a shared filesystem). The
first marks its directory with a number drawn for the run; where every
other process finds that mark in its own, the directory is shared, and
the first alone writes it (`Turns`).
"""

import contextlib
import json
import os
import secrets
import socket
import time

from keras_transformer.files import write_atomically

try:
    import fcntl
except ImportError:  # Windows: no advisory locks to take; runs are not refused
    fcntl = None

LOCK_FILE = ".run.lock"
# The first process's mark of a run's model directory (`shares_directory`).
RUN_MARK_FILE = ".run-id"


class DirectoryInUse(ValueError):
    """Another process trains into the model directory."""


@contextlib.contextmanager
def run_lock(model_dir):
    """Holds `model_dir`'s lock while inside; raises `DirectoryInUse`,
    naming the holder, if another process holds it."""
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, LOCK_FILE)
    with open(path, "a+", encoding="utf-8") as file:
        if fcntl is not None:
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                raise DirectoryInUse(
                    f"{model_dir} is in use by another training run ({_holder(file.read())}). Two runs cannot "
                    "share a model directory (a run's processes share one only where each finds the first's "
                    "mark in it): give this one another --model-dir, or wait for that run to end."
                ) from None
        file.seek(0)
        file.truncate()
        file.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}))
        file.flush()
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(file.fileno(), fcntl.LOCK_UN)


def _holder(text):
    """Who holds the lock, as its file says."""
    try:
        holder = json.loads(text)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
        return f"process {holder['pid']} on {holder['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not yet written its name"


@contextlib.contextmanager
def hold_directory(distribution, model_dir, log=print):
    """Holds `model_dir` for this process of the run while inside (its lock,
    where this process writes it), and gives the run's `Turns`."""
    with contextlib.ExitStack() as held:
        # The first process holds the directory before it marks it its run's.
        if distribution.process_index == 0:
            held.enter_context(run_lock(model_dir))
        shared = shares_directory(distribution, model_dir)
        if distribution.process_index and not shared:
            held.enter_context(run_lock(model_dir))
        writes = distribution.process_index == 0 or not shared
        if shared and writes:
            log(f"model directory: {model_dir}, shared by the run's {distribution.processes} processes; "
                "this one writes it")
        yield Turns(distribution, shared, writes)


class Turns:
    """Who writes the model directory. Alone in it, a process writes and
    reads as it goes. Where the run's processes share it, the first writes
    (`writes`) and the others wait at a barrier, then read what it wrote
    (`in_turn`)."""

    def __init__(self, distribution, shared, writes):
        self.distribution, self.shared, self.writes = distribution, shared, writes

    def in_turn(self, step):
        """`step()`, which writes what it cannot read: the writer's first."""
        if self.shared and not self.writes:
            self.distribution.barrier()
        found = step()
        if self.shared and self.writes:
            self.distribution.barrier()
        return found

    def after_writer(self):
        """Waits, where the directory is shared, until the writer is here."""
        if self.shared:
            self.distribution.barrier()


def shares_directory(distribution, model_dir):
    """Whether every process's `model_dir` is the first process's: it marks
    its own with a number drawn for the run, which the others learn through
    a collective and look for in theirs. A collective: every process calls
    it."""
    if distribution.processes == 1:
        return False
    mark = os.path.join(model_dir, RUN_MARK_FILE)
    # Below 2**31: JAX's collectives hold 32-bit integers unless x64 is on.
    token = 2**30  # above any drawn
    if distribution.process_index == 0:
        token = secrets.randbelow(2**30)
        os.makedirs(model_dir, exist_ok=True)
        write_atomically(mark, str(token))
    token = distribution.least(token)  # the first's: everyone else's is larger
    # Shared by all, or by none: a process that does not see the mark writes
    # its own directory, and the barriers are collectives that all must meet.
    return bool(distribution.least(int(distribution.process_index == 0 or _marked(mark, token))))


def _marked(mark, token):
    try:
        with open(mark, encoding="utf-8") as file:
            return file.read().strip() == str(token)
    except OSError:
        return False
