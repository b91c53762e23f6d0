"""The backend check, torch's thread policy and the quiet command line."""

import os
import platform
import subprocess
import sys

import pytest

from keras_transformer import environment

NOISE_LINES = [
    "I0000 00:00:1795357024.395696    2056 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
    "E0000 00:00:1795357031.798699    2056 util.cc:131] oneDNN supports DT_INT64 only on platforms with AVX-512.",
    "W0000 00:00:1795357031.798699    2056 cpu_feature_guard.cc:227] This TensorFlow binary is optimized",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.",
    "normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use identity normalization.",
]
USER_LINES = [
    "error: --output out.de is not writable.",
    "warning: Line 3 (texts[2]) has 300 subword tokens",
    "Traceback (most recent call last):",
    "  File \"x.py\", line 1, in <module>",
    "ValueError: `source_ids` holds token ids outside the vocabulary",
    "E0000 is how this line starts, but it is no log line",
]


def test_noise_patterns_match_log_lines_and_nothing_a_user_needs():
    for line in NOISE_LINES:
        assert environment.NOISE.match(line.encode()), line
    for line in USER_LINES:
        assert not environment.NOISE.match(line.encode()), line


# Loads environment.py alone, without the package (and so without
# TensorFlow), and prepares the process as the package does on import.
CHILD = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("environment", sys.argv[1])
environment = importlib.util.module_from_spec(spec)
spec.loader.exec_module(environment)
environment.prepare()
for line in sys.argv[2:]:
    os.write(2, (line + "\\n").encode())  # as C++ code writes: to fd 2
print("done", file=sys.stderr)
"""


def run_child(**environment_variables):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_TRANSFORMER_")}
    return subprocess.run(
        [sys.executable, "-c", CHILD, environment.__file__, *NOISE_LINES, *USER_LINES],
        capture_output=True, text=True, timeout=60, env=env | environment_variables,
    )


def test_quiet_processes_filter_file_descriptor_2_and_verbose_ones_do_not():
    quiet = run_child(KERAS_TRANSFORMER_QUIET="1")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stderr.splitlines() == USER_LINES + ["done"]
    verbose = run_child(KERAS_TRANSFORMER_QUIET="1", KERAS_TRANSFORMER_VERBOSE="1")
    assert verbose.stderr.splitlines() == NOISE_LINES + USER_LINES + ["done"]
    # A library import leaves stderr alone.
    library = run_child()
    assert library.stderr.splitlines() == NOISE_LINES + USER_LINES + ["done"]


def test_an_unknown_backend_lists_the_valid_ones():
    with pytest.raises(environment.BackendError, match=r"'mxnet'.*Expected one of: tensorflow, jax, torch"):
        environment.check_backend("mxnet")
    for command in ([sys.executable, "-m", "keras_transformer", "--help"],):
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=300,
            env=dict(os.environ, KERAS_BACKEND="mxnet"),
        )
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            "error: Unknown Keras backend 'mxnet' (from KERAS_BACKEND or keras.json). "
            "Expected one of: tensorflow, jax, torch."
        ]


def test_a_backend_that_is_not_installed_names_the_extra(monkeypatch):
    real_find_spec = environment.importlib.util.find_spec
    monkeypatch.setattr(
        environment.importlib.util, "find_spec",
        lambda name, *a: None if name == "jax" else real_find_spec(name, *a),
    )
    with pytest.raises(environment.BackendError, match=r'needs the .jax. package.*pip install "keras-vaswani\[jax\]"'):
        environment.check_backend("jax")
    assert environment.check_backend("tensorflow") == "tensorflow"


def test_torch_threads_wait_passively_unless_told_otherwise(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for backend, preset, expected in (
        ("torch", None, "PASSIVE"),
        ("torch", "ACTIVE", "ACTIVE"),
        ("tensorflow", None, None),
        ("jax", None, None),
    ):
        if preset is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", preset)
        passive = environment.set_thread_policy(backend)
        assert os.environ.get("OMP_WAIT_POLICY") == expected
        assert passive == (expected == "PASSIVE")


# Loads environment.py alone (the package would import TensorFlow), lets it
# set malloc up, then allocates 64 MB and reports how much of
# the process's memory is in memory maps (glibc's mallinfo2).
MALLOC_PROBE = """
import ctypes, importlib.util, sys
spec = importlib.util.spec_from_file_location("environment", sys.argv[1])
environment = importlib.util.module_from_spec(spec)
spec.loader.exec_module(environment)
changed = environment.allocate_from_the_heap()
block = bytearray(64 << 20)

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    ).split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
print(changed, libc.mallinfo2().hblkhd >= len(block))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="mallopt and mallinfo2 are glibc's",
)
@pytest.mark.parametrize(
    "user_setting, expected",
    [
        (None, "True False"),
        (("MALLOC_MMAP_THRESHOLD_", str(1 << 20)), "False True"),
        (("GLIBC_TUNABLES", "glibc.malloc.check=0"), "False True"),
        (("LD_PRELOAD", ""), "True False"),
    ],
)
def test_large_tensors_come_from_the_heap_unless_the_user_chose_an_allocator(user_setting, expected):
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("MALLOC_") and name not in ("LD_PRELOAD", "GLIBC_TUNABLES")
    }
    if user_setting:
        env[user_setting[0]] = user_setting[1]
    result = subprocess.run(
        [sys.executable, "-c", MALLOC_PROBE, environment.__file__],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # "changed maps": a 64 MB block is mapped unless malloc was changed.
    assert result.stdout.split() == expected.split()


# What a process looks like after it imported `sys.argv[1]` ("keras", or
# the package): its environment, its stderr, the backend's thread counts,
# where a 64 MB block comes from, and Keras's global settings.
OBSERVER = """
import ctypes, json, os, sys
stderr_before = os.fstat(2).st_ino
if sys.argv[2] == "command":
    sys.argv[0] = "keras-transformer"  # as the console script runs
__import__(sys.argv[1])
import keras
observed = {
    "environ": dict(os.environ),
    "stderr": os.fstat(2).st_ino == stderr_before,
    "policy": keras.config.dtype_policy().name,
    "floatx": keras.config.floatx(),
    "epsilon": keras.config.epsilon(),
}
if keras.backend.backend() == "torch":
    import torch
    observed["threads"] = [torch.get_num_threads(), torch.get_num_interop_threads()]
elif keras.backend.backend() == "tensorflow":
    import tensorflow as tf
    observed["threads"] = [tf.config.threading.get_intra_op_parallelism_threads(),
                           tf.config.threading.get_inter_op_parallelism_threads()]

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    ).split()]

if sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallinfo2"):
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    block = bytearray(64 << 20)
    observed["mapped"] = libc.mallinfo2().hblkhd >= len(block)
print(json.dumps(observed))
"""


def observe(module, how="library"):
    import json

    env = {
        k: v for k, v in os.environ.items()
        # pytest's PYTEST_CURRENT_TEST names the phase, setup or call.
        if not k.startswith(("KERAS_TRANSFORMER_", "PYTEST_"))
        and k not in ("OMP_WAIT_POLICY", "TF_CPP_MIN_LOG_LEVEL")
    }
    result = subprocess.run(
        [sys.executable, "-c", OBSERVER, module, how],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def after_import():
    """A fresh process after `import keras_transformer`, observed."""
    return observe("keras_transformer")


def test_importing_the_package_changes_nothing_in_the_process(after_import):
    assert after_import == observe("keras")


def test_the_command_line_runs_with_the_process_settings(after_import):
    import keras

    command = observe("keras_transformer", "command")
    library = after_import
    backend = keras.backend.backend()
    assert command["environ"].get("OMP_WAIT_POLICY") == ("PASSIVE" if backend == "torch" else None)
    assert command["environ"].get("TF_CPP_MIN_LOG_LEVEL") == "1"
    assert not command["stderr"]  # filtered through a pipe
    if "mapped" in library:
        assert library["mapped"] and not command["mapped"]
