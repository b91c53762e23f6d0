"""The package changes nothing in Keras, TensorFlow, JAX or PyTorch: its
speed comes from its own code (keras_transformer/backend/)."""

import ast
import os
import pathlib
import subprocess
import sys

import keras
from conftest import in_one_pass

import keras_transformer

PACKAGE = pathlib.Path(keras_transformer.__file__).parent

# Attributes of other packages that their documentation asks users to set.
DOCUMENTED_HOOKS = {
    "warnings.showwarning",  # "You may replace this function with any callable"
}


def _root(node):
    """The name at the root of `a.b.c` (or of `a.b.c[...]`), else None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def rebindings(source, filename):
    """`file:line: target` for each assignment in `source` that rebinds an
    attribute of a name imported from another package, or of a name bound
    to such an attribute (`layer_class = keras.layers.Layer`), and each
    `setattr` or `delattr` on one."""
    tree = ast.parse(source, filename)
    foreign = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("keras_transformer"):
                    foreign.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").startswith("keras_transformer"):
                foreign.update(alias.asname or alias.name for alias in node.names)
    changed = True
    while changed:  # names bound to a foreign name's attributes, in turn
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
                if _root(node.value) in foreign:
                    for target in node.targets:
                        if isinstance(target, ast.Name) and target.id not in foreign:
                            foreign.add(target.id)
                            changed = True
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("setattr", "delattr") and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            for leaf in ast.walk(target) if isinstance(target, ast.Tuple) else [target]:
                if isinstance(leaf, ast.Attribute) and _root(leaf) in foreign:
                    name = _dotted(leaf)
                    if name not in DOCUMENTED_HOOKS:
                        found.append(f"{filename}:{node.lineno}: {name}")
    return found


def test_the_rebinding_check_finds_patches():
    """The premise: the check finds the forms a patch takes."""
    patches = """
import keras
import torch.nn.functional as F
from keras.src.backend.torch import core
from keras.layers import Layer

keras.layers.Layer.__call__ = lambda self: None
F.scaled_dot_product_attention = None
core.while_loop = None
Layer.call = None
layer_class = keras.layers.Layer
layer_class.__call__ = None
setattr(core, "convert_to_tensor", None)
"""
    assert len(rebindings(patches, "patches.py")) == 6
    clean = """
import keras
import warnings
from keras_transformer.layers import calls

calls.DirectCalls.flag = 1
model = keras.Model()
model.name = "ours"
warnings.showwarning = print
"""
    assert rebindings(clean, "clean.py") == []


@in_one_pass("jax", "reads the package's source")
def test_no_module_of_the_package_rebinds_an_attribute_of_another_package():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += rebindings(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert found == []


def test_private_keras_names_are_few_and_in_the_backend_package():
    lines = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "keras.src" in line
    ]
    assert len(lines) <= 3, lines
    assert all(line.startswith("backend/") for line in lines), lines


def test_no_module_of_the_package_exceeds_500_lines():
    long = {
        str(path.relative_to(PACKAGE)): count
        for path in PACKAGE.rglob("*.py")
        if (count := len(path.read_text().splitlines())) > 500
    }
    assert long == {}


UNTOUCHED = """
import sys

import keras


def snapshot():
    # Every function and class of Keras's modules, and each class's own
    # attributes, as they are before the package is imported.
    seen = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "keras" or name.startswith("keras.")):
            continue
        for attribute, value in list(vars(module).items()):
            if callable(value):
                seen[(name, attribute)] = value
                if isinstance(value, type):
                    for member, inner in list(vars(value).items()):
                        seen[(name, attribute, member)] = inner
    return seen


before = snapshot()
keras_call = keras.layers.Layer.__call__

import numpy as np

import keras_transformer as kt
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import builtin_corpus

tokenizer = SubwordTokenizer.train(builtin_corpus("train", size=300, seed=0), 400)
# One block a stack: every layer the package has, half the compiling.
model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1)
kt.training.compile_model(model)
ids = np.random.default_rng(0).integers(3, tokenizer.vocabulary_size, (4, 6)).astype("int32")
model.fit({"source_ids": ids, "target_ids": ids}, ids, batch_size=4, epochs=1, verbose=0)
for quantize in (None, "int8"):
    translator = kt.Translator(model, tokenizer, beam_size=2, max_extra_length=2, quantize=quantize)
    assert len(translator.translate(["the dog ."])) == 1

assert keras.layers.Layer.__call__ is keras_call
changed = sorted(
    ".".join(key) for key, value in before.items()
    if (vars(sys.modules[key[0]]).get(key[1]) if len(key) == 2
        else vars(vars(sys.modules[key[0]]).get(key[1], object)).get(key[2])) is not value
)
print("changed:", changed)
assert not changed
"""


def test_keras_is_keras_s_own_after_the_package_trains_and_decodes():
    """In a fresh process: every function and class of Keras's modules, and
    every attribute of each class (`Layer.__call__` among them), is the
    same object before the package is imported and after it has trained a
    step and translated, in float32 and in int8."""
    result = subprocess.run(
        [sys.executable, "-c", UNTOUCHED],
        capture_output=True,
        text=True,
        env={**os.environ, "KERAS_BACKEND": keras.backend.backend()},
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "changed: []" in result.stdout
