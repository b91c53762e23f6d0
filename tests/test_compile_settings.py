"""A model compiled and trained under any backend, saved, then loaded under
any other, goes on training with nothing set by hand: every backend's two
files (`jit_compile` at its default and True, tests/compile_and_save.py),
loaded here, fit two more steps. Each backend's files are made once across
CI's passes, which run side by side (`made_once_across_passes`)."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import compile_and_save
from conftest import made_once_across_passes

BACKENDS = ("tensorflow", "jax", "torch")
HERE = os.path.dirname(os.path.abspath(__file__))


def saved_under(request, backend):
    def make(directory):
        if backend == keras.backend.backend():
            compile_and_save.save_compiled(directory)
            return
        done = subprocess.run(
            [sys.executable, os.path.join(HERE, "compile_and_save.py"), str(directory)],
            env=dict(os.environ, KERAS_BACKEND=backend), capture_output=True, text=True, timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    return made_once_across_passes(request, f"compiled-{backend}", make, os.path.join(HERE, "compile_and_save.py"))


@pytest.fixture(scope="module")
def saved(request):
    # This pass's own backend first, in this process, while the others' passes make theirs.
    order = sorted(BACKENDS, key=lambda backend: backend != keras.backend.backend())
    return {backend: saved_under(request, backend) for backend in order}


@pytest.mark.parametrize("setting", sorted(compile_and_save.SETTINGS))
@pytest.mark.parametrize("saved_by", BACKENDS)
def test_a_model_saved_under_any_backend_goes_on_training_here(saved, saved_by, setting):
    model = keras.saving.load_model(os.path.join(saved[saved_by], f"{saved_by}-{setting}.keras"))
    # The default is this backend's own (Keras saved "auto", not what the
    # saving backend resolved it to); True stays True (torch.compile here
    # under torch).
    assert model.jit_compile == (True if setting == "jit" else this_backend_s_default())
    steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(*compile_and_save.batch(1), batch_size=4, epochs=1, verbose=0)
    assert all(np.isfinite(history.history["loss"]))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == steps + 2 == 4
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights()))


def this_backend_s_default():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model.jit_compile
