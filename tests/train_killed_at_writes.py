"""`keras-transformer train` killed at each of its file writes in turn, and resumed.

    python tests/train_killed_at_writes.py FOLDER MAX_WRITES TRAIN_ARGUMENTS...

TRAIN_ARGUMENTS holds RUN where the model directory goes. For k = 1, 2, ...:
a run in FOLDER/k is killed at its k-th file write (the k-th file it opens
for writing there, left created and empty, as a kill inside the write would
leave it), then the same command with --resume runs to its end. It stops at
the first k that the run ends before reaching, or at MAX_WRITES. Prints one
JSON line per k: the file the kill hit (its final name), and each run's exit
code (-9 for the kill).

The package (and TensorFlow, for TensorBoard logs) is imported once and
each run is a fork of this process, so a run costs its own work, not a
start-up. Nothing here runs a backend operation before forking, so no
thread pool is copied into a child.
"""

import json
import os
import re
import signal
import sys
import traceback

from keras_transformer.cli import main
from keras_transformer.files import PARTIAL_PREFIX

try:  # what each run would import for its TensorBoard logs (2-3 s), imported once
    import tensorflow  # noqa: F401
except ImportError:
    pass

# atomic_path's temporary names: PARTIAL_PREFIX + name + "." + random + suffix.
PARTIAL = re.compile(re.escape(PARTIAL_PREFIX) + r"(.+)\.[^.]+\.[^.]+$")
# A `.keras` file's parts, written first into a folder named after its
# temporary file + "." + random: the same write as that file's.
PARTS = re.compile("(" + re.escape(PARTIAL_PREFIX) + r"[^/]+)\.[^./]+/.*$")


def kill_at_write(folder, count, hit):
    written = []

    def hook(event, args):
        if event != "open" or not isinstance(args[0], str) or not args[2] & (os.O_WRONLY | os.O_RDWR):
            return
        path = os.path.realpath(args[0])
        if not path.startswith(folder + os.sep) or os.path.isdir(path):
            return
        write = PARTS.sub(r"\1", os.path.relpath(path, folder))
        if write in written:
            return
        written.append(write)  # a file's first open for writing; later ones are the same write
        if len(written) == count:
            with open(hit, "w") as file:
                file.write(PARTIAL.sub(r"\1", write))
            open(path, "wb").close()
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def run(arguments, folder=None, kill_at=None, hit=None):
    """Runs the command in a forked child; its exit code (-9 if killed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if kill_at is not None:
                sys.addaudithook(kill_at_write(folder, kill_at, hit))
            main(arguments)
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
            if not isinstance(exit.code, int):
                print(exit.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported, then the child ends
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main_loop(folder, max_writes, template):
    for k in range(1, max_writes + 1):
        run_dir = os.path.realpath(os.path.join(folder, str(k)))
        arguments = [run_dir if a == "RUN" else a for a in template]
        hit = run_dir + ".hit"
        killed = run(arguments, run_dir, kill_at=k, hit=hit)
        if killed != -signal.SIGKILL:
            print(json.dumps({"write": k, "file": None, "killed": killed, "resumed": None}), flush=True)
            return
        resumed = run(arguments + ["--resume"])
        with open(hit) as file:
            name = file.read()
        print(json.dumps({"write": k, "file": name, "killed": killed, "resumed": resumed}), flush=True)


if __name__ == "__main__":
    main_loop(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
