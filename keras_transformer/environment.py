"""The process the package runs in: which backend, how its threads wait,
where large tensors are allocated, and how much third-party logging reaches
the terminal.

This module imports only the standard library. Importing the package
checks the backend and changes nothing else: `KERAS_BACKEND` (or
`~/.keras/keras.json`) must name one of `BACKENDS`, and its package must
be installed; otherwise the error says which names are valid, or which
extra to install.

The command line (`keras-transformer`, `python -m keras_transformer`), and
scripts that set `KERAS_TRANSFORMER_QUIET=1` before importing the package
(the recipes), run with `configure_process()`'s settings, applied before
Keras and its backend are imported:

- torch's OpenMP threads wait passively (`OMP_WAIT_POLICY=PASSIVE`, unless
  it is set): busy-waiting, torch's threads spin against the `tf.data`
  threads that feed them, and a step on a small CPU takes many times longer;
- large tensors come from the heap (glibc's `mallopt`), not from fresh
  memory maps: glibc maps large allocations from the OS and gives them
  back when they are freed, so every `[B, T, V]` tensor of a step
  page-faulted its whole size in again; on a virtual machine, where a
  fault costs microseconds, the small model trained 1.22x faster under
  TensorFlow with a fifth of the system time (a timing in git history). A
  process whose allocator the user has chosen (`LD_PRELOAD`,
  `GLIBC_TUNABLES` or a `MALLOC_*` variable) keeps it;
- quiet output: TensorFlow's, XLA's and SentencePiece's C++ log lines (CUDA
  probes, CPU feature notices, "precompiled_charsmap is empty") are
  filtered out of stderr. `--verbose`, or `KERAS_TRANSFORMER_VERBOSE=1`,
  shows everything.

A Python program calls `keras_transformer.configure_process()` to get the
same settings (the thread policy only takes effect before torch is
imported: set `OMP_WAIT_POLICY=PASSIVE` in the shell instead).
"""

import atexit
import ctypes
import importlib.util
import json
import os
import re
import sys
import threading

BACKENDS = ("tensorflow", "jax", "torch")

COMMAND_NAME = "keras-transformer"

# One pattern per source of log lines that a user has to learn to ignore.
NOISE = re.compile(
    rb"|".join(
        [
            # absl / glog lines of TensorFlow and XLA's C++ code:
            # "I0000 00:00:1795357024.395696    2056 cudart_stub.cc:31] ..."
            rb"^[IWE]\d{4} [\d:.]+\s+\d+ [\w.\-]+:\d+\] ",
            rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
            # The second line of TensorFlow's CPU feature notice.
            rb"^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.",
            # SentencePiece's own logging, in tensorflow-text's ops:
            # "normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. ..."
            rb"^[\w.]+\.cc\(\d+\) LOG\(INFO\) ",
        ]
    )
)


class BackendError(ImportError):
    """The chosen Keras backend is unknown, or its package is missing."""


def selected_backend():
    """The backend Keras will load: `KERAS_BACKEND`, else the config file."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    keras_home = os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~"), ".keras"
    )
    try:
        with open(os.path.join(keras_home, "keras.json")) as file:
            return json.load(file).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def check_backend(backend=None):
    """Raises `BackendError` unless `backend` is usable here.

    Returns:
        the backend's name.
    """
    backend = backend if backend is not None else selected_backend()
    if backend not in BACKENDS:
        raise BackendError(
            f"Unknown Keras backend {backend!r} (from KERAS_BACKEND or "
            f"keras.json). Expected one of: {', '.join(BACKENDS)}."
        )
    # Each backend's package, and the pip extra that installs it, is named
    # as the backend is.
    package = backend
    if importlib.util.find_spec(package) is None:
        raise BackendError(
            f"KERAS_BACKEND={backend} needs the {package!r} package, which is "
            f"not installed. Install it with the package's extra: "
            f'pip install "keras-vaswani[{backend}]" (or, in a clone, '
            f'pip install -e ".[{backend}]").'
        )
    return backend


def running_as_command():
    """True in `keras-transformer ...` and `python -m keras_transformer ...`."""
    if os.path.basename(sys.argv[0]) == COMMAND_NAME:
        return True
    arguments = list(getattr(sys, "orig_argv", []))
    for index, argument in enumerate(arguments[:-1]):
        if argument == "-m":
            return arguments[index + 1] == "keras_transformer"
    return False


def verbose_requested():
    if os.environ.get("KERAS_TRANSFORMER_VERBOSE", "") not in ("", "0"):
        return True
    return running_as_command() and "--verbose" in sys.argv[1:]


def prepare():
    """Checks the backend; in the command line and the recipes, also applies
    `configure_process(quiet=True)`.

    Called by `keras_transformer/__init__.py` before Keras is imported. A
    bad backend raises `BackendError`; on the command line it prints one
    `error:` line and exits with status 2 instead.
    """
    try:
        backend = check_backend()
    except BackendError as error:
        if running_as_command():
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    if running_as_command() or os.environ.get("KERAS_TRANSFORMER_QUIET", "") not in ("", "0"):
        configure_process(quiet=True, backend=backend)


def configure_process(quiet=False, backend=None):
    """The process settings the command line runs with, for a Python program.

    Args:
        quiet: also filter TensorFlow's, XLA's and SentencePiece's C++ log
            lines out of stderr (unless `KERAS_TRANSFORMER_VERBOSE=1`).
        backend: the Keras backend; by default the one Keras will load.

    Returns:
        the names of the settings that took effect, of "threads" (torch's
        passive OpenMP threads: only before torch is imported), "heap"
        (glibc's malloc keeps large blocks) and "quiet".
    """
    backend = backend or selected_backend()
    applied = []
    if set_thread_policy(backend):
        applied.append("threads")
    if allocate_from_the_heap():
        applied.append("heap")
    if quiet and not verbose_requested():
        quiet_third_party_logs()
        applied.append("quiet")
    return applied


def set_thread_policy(backend):
    """Makes torch's OpenMP threads sleep, not spin, while they wait.

    Returns:
        whether torch's threads will wait passively.
    """
    if backend != "torch" or "torch" in sys.modules:
        return False
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE"


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
# Free memory at the top of the heap that is kept for the next step's
# tensors rather than given back to the OS.
KEPT_FREE_BYTES = 1 << 30

_heap_only = False


def allocate_from_the_heap():
    """On glibc: no memory maps for large allocations, and freed memory is
    kept for the next ones.

    Returns:
        whether malloc was changed, now or by an earlier call.
    """
    global _heap_only
    if _heap_only:
        return True
    if not sys.platform.startswith("linux"):
        return False
    if os.environ.get("LD_PRELOAD") or os.environ.get("GLIBC_TUNABLES"):
        return False
    if any(name.startswith("MALLOC_") for name in os.environ):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, for one)
        return False
    _heap_only = bool(mallopt(M_MMAP_MAX, 0)) and bool(
        mallopt(M_TRIM_THRESHOLD, KEPT_FREE_BYTES)
    )
    return _heap_only


_filter = None


def quiet_third_party_logs():
    """Filters the `NOISE` lines out of file descriptor 2, for this process
    and the processes it starts; every other line passes unchanged."""
    global _filter
    if _filter is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        _filter = _StderrFilter()


def stop_filtering_stderr():
    """Gives file descriptor 2 back to the real stderr, after the filter has
    passed on what it holds: before `os._exit`, which ends its thread."""
    global _filter
    if _filter is not None:
        _filter.close()
        _filter = None


class _StderrFilter:
    """Points file descriptor 2 at a pipe, and copies the lines that are not
    noise from the pipe to the real stderr in a thread."""

    def __init__(self):
        sys.stderr.flush()
        self.real_stderr = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self.thread = threading.Thread(
            target=self._copy, args=(read_end,), name="stderr-filter", daemon=True
        )
        self.thread.start()
        atexit.register(self.close)

    def _copy(self, read_end):
        pending = b""
        while chunk := os.read(read_end, 1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not NOISE.match(line))
            if kept:
                os.write(self.real_stderr, kept)
        if pending and not NOISE.match(pending):
            os.write(self.real_stderr, pending)
        os.close(read_end)

    def close(self):
        """Gives fd 2 back to the real stderr and lets the copier finish."""
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self.real_stderr, 2)  # closes the pipe's last write end here
        self.thread.join(timeout=5)


def _cpuinfo(field):
    """The first value of `field` in /proc/cpuinfo, or "" where there is none."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_vendor():
    """The CPU's vendor as the CPU names itself ("GenuineIntel",
    "AuthenticAMD"), or "" where the system does not say."""
    import platform

    # Windows names it at the end: "Intel64 Family 6 Model 143 Stepping 8, GenuineIntel".
    known = [vendor for vendor in ("GenuineIntel", "AuthenticAMD") if vendor in platform.processor()]
    return _cpuinfo("vendor_id") or (known[0] if known else "")


def describe_machine():
    """The CPU's name and core count, for reports of results: "AMD EPYC, 2 cores"."""
    import platform

    return f"{_cpuinfo('model name') or platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores"


def tensorflow_beside_backend():
    """TensorFlow for work beside another backend (TensorBoard logs), with
    its GPUs hidden so that it takes none of the accelerators' memory; None
    where it is not installed."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    import keras

    if keras.backend.backend() != "tensorflow":
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # its devices were set up already
            pass
    return tf
