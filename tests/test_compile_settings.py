"""A model compiled and trained under any backend, saved, then loaded under
any other, goes on training with nothing set by hand.

Each backend compiles the tiny model with `jit_compile` at its default and
with True, fits two steps and saves it (tests/compile_and_save.py); each
file is made once across CI's passes, which run side by side
(`made_once_across_passes`). Every backend loads every default file, and
the JAX and TensorFlow files made with True, and fits two more steps.
Under torch, True is `torch.compile`, which Keras's layer calls break into
a frame per layer: two minutes of Inductor for the tiny Transformer on CI's
2 cores. So torch loads the JAX file made with True, the case users met (a
model compiled with Keras's default under JAX, saved as True before
`jit_compile` was saved as given), and keeps its True; what trains through
`torch.compile` there is a model of the package's own layers that holds
each eager fast path that must step aside inside it (oneDNN's products,
which Inductor refused, the host-seeded dropout, the id check's read back,
the fused Adam update), a quarter of the compiling. Torch makes no file
with True of its own, which the JAX and TensorFlow passes would wait on."""

import json
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
THIS = keras.backend.backend()


def saved(request, backend, setting):
    """The directory holding `<backend>-<setting>.keras` and its `.json`."""

    def make(directory):
        if backend == THIS:
            compile_and_save.save_compiled(directory, setting)
            return
        done = subprocess.run(
            [sys.executable, os.path.join(HERE, "compile_and_save.py"), str(directory), setting],
            env=dict(os.environ, KERAS_BACKEND=backend), capture_output=True, text=True, timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    return made_once_across_passes(request, f"compiled-{backend}-{setting}", make, os.path.join(HERE, "compile_and_save.py"))


# Torch's own file made with True would be loaded nowhere: its True is
# `torch.compile`, which the JAX file's cell below runs here.
MADE = ("auto",) if THIS == "torch" else sorted(compile_and_save.SETTINGS)


@pytest.mark.parametrize("setting", MADE)
def test_compiled_either_way_the_model_fits_and_saves_here(request, setting):
    """This backend's own files, as the others load them."""
    directory = saved(request, THIS, setting)
    record = json.loads((directory / f"{THIS}-{setting}.json").read_text())
    assert record["jit_compile"] == (True if setting == "jit" else this_backend_s_default())
    assert len(record["losses"]) == 1 and np.isfinite(record["losses"][0])


LOADED = [(backend, "auto") for backend in BACKENDS] + [
    (backend, "jit") for backend in (() if THIS == "torch" else ("tensorflow", "jax"))
]


@pytest.mark.parametrize("saved_by, setting", LOADED)
def test_a_model_saved_under_any_backend_goes_on_training_here(request, saved_by, setting):
    directory = saved(request, saved_by, setting)
    model = keras.saving.load_model(directory / f"{saved_by}-{setting}.keras")
    # The default is this backend's own (Keras saved "auto", not what the
    # saving backend resolved it to); True stays True.
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


@pytest.mark.skipif(THIS != "torch", reason="torch.compile is the torch backend's compiler")
def test_under_torch_true_is_torch_compile_and_the_package_s_layers_train_through_it(request):
    """What a model saved with True under JAX becomes here, and the eager
    paths of the package that `torch.compile` cannot trace stepping aside
    inside it. The compiled steps' loss is the eager steps' but for the
    dropout masks, which Keras's dropout draws there in place of ours."""
    directory = saved(request, "jax", "jit")
    assert keras.saving.load_model(directory / "jax-jit.keras").jit_compile is True

    ids, labels = compile_and_save.batch(1)[0]["source_ids"], compile_and_save.batch(2)[1]
    losses = []
    for jit_compile in (False, True):
        model = compile_and_save.layers_model(jit_compile)
        before = model.get_weights()
        losses.append(model.fit(ids, labels, batch_size=4, epochs=1, verbose=0).history["loss"][0])
        assert model.jit_compile is jit_compile and np.isfinite(losses[-1])
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2
        assert all(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights(), strict=True))
    assert losses[1] == pytest.approx(losses[0], rel=0.02)
