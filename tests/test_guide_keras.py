"""docs/guide_keras.md, a Keras user's script, run block by block under this
backend with smaller numbers: its `continue.py` under the next backend, in
a process of its own, as the guide runs it."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import in_one_pass
from test_docs_python import python_block, run, smaller

GUIDE = "docs/guide_keras.md"
BACKENDS = ("tensorflow", "jax", "torch")
# The guide's sizes, for a run of seconds (each replacement must be there).
SMALLER = {
    'builtin_corpus("train", size=5000)': 'builtin_corpus("train", size=600)',
    "steps_per_epoch=200, epochs=10,": "steps_per_epoch=3, epochs=2,",
    "steps_per_epoch=200, epochs=1)": "steps_per_epoch=2, epochs=1)",
    "size=5000, seed=1": "size=300, seed=1",
    # One bucket for training: one train step to compile (two for two lengths).
    "buckets=6,\n": "buckets=1,\n",
    "buckets=6, repeat=True": "buckets=1, repeat=True",
    # Two validation batches of two lengths: predict's padding still shows.
    'builtin_corpus("valid", size=200)': 'builtin_corpus("valid", size=40)',
    "buckets=6, shuffle=False": "buckets=2, shuffle=False",
    "steps_per_epoch=100, epochs=1)": "steps_per_epoch=2, epochs=1)",
}


def block(line):
    found = python_block(GUIDE, line)
    return smaller(found, {old: new for old, new in SMALLER.items() if old in found})


def test_the_guide_s_script_trains_saves_goes_on_under_another_backend_and_reuses_the_layers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names, _ = run(block("make_dataset(train_pairs"))
    names, printed = run(block("keras.callbacks.EarlyStopping"), **names)
    model, valid_data = names["model"], names["valid_data"]
    assert {"loss", "val_loss", "masked_token_accuracy", "perplexity"} <= set(model.history.history)
    assert "target_tokens" not in model.history.history
    assert all((tmp_path / "runs" / "keras" / name).exists() for name in ("best.keras", "model.keras", "subword.model"))
    assert any(files for _, _, files in os.walk(tmp_path / "runs" / "keras" / "logs"))  # TensorBoard's events
    assert "'loss':" in printed and "'perplexity':" in printed
    rows = sum(len(valid_data[i][1]) for i in range(len(valid_data)))
    assert len({valid_data[i][1].shape[1] for i in range(len(valid_data))}) == 2  # so predict pads the shorter
    assert names["logits"].shape == (rows, valid_data.longest, names["tokenizer"].vocabulary_size)

    # continue.py, as the guide runs it: a process of another backend.
    other = BACKENDS[(BACKENDS.index(keras.backend.backend()) + 1) % len(BACKENDS)]
    (tmp_path / "continue.py").write_text(block("# continue.py"))
    done = subprocess.run([sys.executable, "continue.py"], env=dict(os.environ, KERAS_BACKEND=other),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("['")  # a list of one translation
    assert (tmp_path / "runs" / "keras" / "translator" / "model.keras").is_file()

    names, printed = run(block("compile=True)"), more_data=names["train_data"], **names)
    translator = names["translator"]
    steps = int(keras.ops.convert_to_numpy(translator.model.optimizer.iterations))
    assert steps == 3 * 2 + 2 + 2  # the first fit's, continue.py's, and this one's: the file's optimizer state
    assert printed.strip().splitlines()[-1].startswith("['")

    names, _ = run(block("kt.layers.TransformerEncoderBlock"), **names)
    assert names["classifier"].output_shape == (None, 2)
    assert (tmp_path / "runs" / "keras" / "classifier.png").read_bytes()[:4] == b"\x89PNG"


@in_one_pass("tensorflow", "the export is a TensorFlow graph under every backend (test_export.py exports what JAX and torch trained)")
def test_the_guide_s_export_loads_in_a_fresh_python_with_its_operations(tmp_path, monkeypatch, translation_model,
                                                                        translation_tokenizer):
    """`load_saved_model` in a process that imported nothing else: there
    `tf.saved_model.load` alone says 'Op type not registered'."""
    import keras_transformer as kt

    monkeypatch.chdir(tmp_path)
    translator = kt.Translator(translation_model, translation_tokenizer, beam_size=2, max_extra_length=8)
    run(python_block(GUIDE, "export_saved_model(translator"), translator=translator)
    # One fresh process (each costs an import of TensorFlow): a plain
    # `tf.saved_model.load` first, which must fail, then the guide's block.
    plain = (
        "import sys\nimport tensorflow as tf\n"
        "try:\n    tf.saved_model.load('runs/keras/export/1')\n"
        "except Exception as error:\n    print('REFUSED:', error, file=sys.stderr)\n"
        "assert 'tensorflow_text' not in sys.modules and 'keras_transformer' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", plain + python_block(GUIDE, "load_saved_model(")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # Named: the first of the graph's tensorflow-text operations TensorFlow meets (SentencepieceOp or another).
    assert "Op type not registered '" in done.stderr.partition("REFUSED:")[2], done.stderr[-600:]
    expected = translator.translate(["The old man sees the dog."])[0]
    assert repr(expected.encode()) in done.stdout
