"""The private Keras names the package touches: at most twelve, all in
`keras_transformer/backend/keras_private.py`, each with a public fallback
(nine of them are the optimizer's pieces and state that accumulation over
several TensorFlow replicas runs one by one: keras_private.ReplicaAccumulation).

Keras's private names are found by introspection: the attributes that start
with one underscore on Keras's classes (and their bases within Keras) and on
built instances of the ones the package uses. The package's own code is
walked as syntax: an attribute access, a `getattr`-like call with a string
name, or an import from `keras.src`.
"""

import ast
import functools
import pathlib

import keras
import numpy as np
from conftest import in_one_pass

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_transformer"
ALLOWED_MODULE = PACKAGE / "backend" / "keras_private.py"
MOST_NAMES = 12

KERAS_CLASSES = [
    keras.Model, keras.Sequential, keras.layers.Layer, keras.layers.Dense, keras.layers.EinsumDense,
    keras.layers.Embedding, keras.layers.LayerNormalization, keras.layers.Dropout, keras.Variable,
    keras.optimizers.Optimizer, keras.optimizers.Adam, keras.optimizers.LossScaleOptimizer,
    keras.optimizers.schedules.LearningRateSchedule, keras.metrics.Metric, keras.metrics.Mean,
    keras.losses.Loss, keras.callbacks.Callback, keras.callbacks.TensorBoard, keras.StatelessScope,
    keras.DTypePolicy, keras.utils.PyDataset, keras.layers.InputSpec, keras.quantizers.Quantizer,
    keras.random.SeedGenerator,
]


def _private(name):
    return name.startswith("_") and not name.startswith("__")


@functools.cache  # the same set for the whole run: one model built and fitted, not one per test
def keras_private_names():
    """The private attribute names of Keras's classes and of built objects."""
    names = set()
    for cls in KERAS_CLASSES:
        for klass in cls.__mro__:
            if klass.__module__.startswith("keras"):
                names.update(filter(_private, vars(klass)))
    dense = keras.layers.Dense(2)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, dense(inputs))
    # With accumulation, whose accumulators a built optimizer holds.
    model.compile(optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2), loss="mse", metrics=["mae"])
    model.fit(np.zeros((2, 3), "float32"), np.zeros((2, 2), "float32"), verbose=0)
    objects = [dense, model, model.optimizer, dense.kernel, keras.metrics.Mean(), keras.callbacks.Callback()]
    for obj in objects:
        names.update(filter(_private, vars(obj)))
    return frozenset(names)


def uses(tree, names):
    """(line, name) of each use of a Keras private name, or of `keras.src`:
    as an attribute, or as a string (`getattr(x, "_name")`, `"_name" in
    vars(x)`) other than a part of an f-string."""
    found = []
    formatted = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Attribute) and node.attr == "src" and getattr(node.value, "id", None) == "keras":
            found.append((node.lineno, "keras.src"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src"):
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("keras.src")]
        elif isinstance(node, ast.Constant) and node.value in names and id(node) not in formatted:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("keras.src"):
            found.append((node.lineno, node.value))  # a module imported by name
    return found


def test_the_walk_finds_private_names_where_they_are():
    names = keras_private_names()
    assert {"_flatten_layers", "_loss_tracker", "_tracker", "_value", "_autocast"} <= names
    source = (
        "import keras.src.utils\nx._loss_tracker\ngetattr(m, '_flatten_layers')\n"
        "f'{a}_tracker'\nx.public\nif '_tracker' in vars(x): pass\n"
        "importlib.import_module('keras.src.backend')\n"
    )
    assert sorted(uses(ast.parse(source), names)) == [
        (1, "keras.src.utils"), (2, "_loss_tracker"), (3, "_flatten_layers"), (6, "_tracker"),
        (7, "keras.src.backend"),
    ]


def test_private_keras_names_are_few_and_all_in_keras_private():
    names = keras_private_names()
    outside, inside = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, name in uses(ast.parse(path.read_text()), names):
            if path == ALLOWED_MODULE:
                inside.add(name)
            else:
                outside.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name}")
    assert not outside, "private Keras names outside backend/keras_private.py:\n" + "\n".join(outside)
    assert len(inside) <= MOST_NAMES, sorted(inside)


# Trains a tiny model for three steps, with dropout, and decodes with it;
# `result` holds the weights' sums, the ids and our warnings.
TRAIN_AND_DECODE = """
import warnings
import keras, numpy as np
import keras_transformer as kt
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    keras.utils.set_random_seed(0)
    model = kt.build_transformer("tiny", vocabulary_size=20, num_layers=1, dropout=0.3)
    kt.training.compile_model(model, warmup_steps=2)
    inputs, labels = kt.data.reversal_task(8, 20, seed=0)
    model.fit(inputs, labels, batch_size=4, epochs=1, verbose=0)
    from keras_transformer.decoding.compiled import CompiledFunction
    search = CompiledFunction(
        lambda source, limits, decoding: kt.decoding.search_translations(
            model, source, limits, beam_size=2, max_extra_length=4, bos_id=2, eos_id=3, decoding=decoding
        ),
        model, [2, 1],
    )
    ids, _ = search(inputs["source_ids"][:2], np.full((2,), 6, "int32"))
ours = [str(w.message) for w in caught if "keras_private" in str(w.message)]
weights = [float(np.abs(w).sum()) for w in model.get_weights()]
result = {"weights": weights, "ids": np.asarray(ids).tolist(), "warnings": ours}
"""

# The same, in a process where Keras's private functions `sys.argv[1:]`
# ("module:name" each) have been removed before the package is imported;
# prints the result.
REMOVED = """
import importlib, json, sys
for removed in sys.argv[1:]:
    module, name = removed.split(":")
    delattr(importlib.import_module(module), name)
""" + TRAIN_AND_DECODE + """
print(json.dumps(result))
"""


def run_here():
    """TRAIN_AND_DECODE in this process, where every name is in place."""
    namespace = {}
    exec(TRAIN_AND_DECODE, namespace)
    return namespace["result"]


def run_removed(*removed):
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_TRANSFORMER_")}
    result = subprocess.run(
        [sys.executable, "-c", REMOVED, *removed], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_without_each_private_name_training_and_decoding_give_the_same_results_with_one_warning():
    """All the names this backend reads are removed in one process (each
    fallback is its own code path): one warning names each, and training
    and decoding give what they give with the names in place (here: only
    the removal needs a fresh process)."""
    from keras_transformer.backend import keras_private

    reference = run_here()
    assert reference["warnings"] == []
    read_here = [
        f"{module}:{name}"
        for module, name, backends in keras_private.PRIVATE_NAMES.values()
        if keras.backend.backend() in backends
    ]
    assert read_here
    removed = run_removed(*read_here)
    for name in read_here:
        named = [w for w in removed["warnings"] if name.replace(":", ".") in w]
        assert len(named) == 1, (name, removed["warnings"])
    assert len(removed["warnings"]) == len(read_here), removed["warnings"]
    assert removed["ids"] == reference["ids"]
    np.testing.assert_allclose(removed["weights"], reference["weights"], rtol=1e-6)


@in_one_pass("jax", "reads the package's source")
def test_no_torchscript_and_no_warning_filters_in_the_package():
    """No `torch.jit` (deprecated since torch 2.14's releases) or other
    TorchScript, and no filter that hides another package's warning."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = ast.unparse(node) if isinstance(node, ast.Attribute) else ""
            if name.startswith("torch.jit") or name in ("warnings.filterwarnings", "warnings.simplefilter"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    assert not found, "\n".join(found)
