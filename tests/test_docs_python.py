"""The Python blocks of the README and the docs, run as written.

A block that uses names from the text around it (a model, ids) gets them
from the test; a block sized for a GPU or a corpus runs with smaller
numbers, each replacement checked to be in the block, so that a changed
block fails here instead of going untested. Which test runs each block,
and why the others do not run: test_docs_commands.py."""

import contextlib
import gzip
import io
import pathlib
import re

import keras
import numpy as np
import pytest
from conftest import in_one_pass

import keras_transformer as kt
from keras_transformer.data import builtin_corpus

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_block(name, line):
    """The Python block of `name` that holds `line`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / name).read_text(), re.S)
    found = [block for block in blocks if line in block]
    assert len(found) == 1, f"{name}: {len(found)} Python blocks hold {line!r}"
    return found[0]


def smaller(block, replacements):
    for old, new in replacements.items():
        assert old in block, f"the block no longer holds {old!r}:\n{block}"
        block = block.replace(old, new)
    return block


def run(block, **names):
    """Runs `block` with `names` defined; its namespace and what it printed."""
    namespace = dict(names)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "<docs>", "exec"), namespace)
    return namespace, printed.getvalue()


@pytest.fixture
def parallel_files(tmp_path, monkeypatch):
    """train.en.gz and train.de.gz, as the blocks read them, in the working
    directory."""
    corpus = builtin_corpus("train", size=400, seed=2)
    for name, lines in (("train.en.gz", corpus.sources), ("train.de.gz", corpus.targets)):
        (tmp_path / name).write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@in_one_pass("torch", "Keras's compile and fit around our layers; the base model's first step is quickest eager")
def test_the_model_block_builds_the_base_model_and_fits_a_step():
    block = python_block("README.md", "model.fit(")
    assert python_block("docs/guide.md", "model.fit(") == block
    rng = np.random.default_rng(0)
    target = rng.integers(3, 37000, size=(2, 6)).astype("int32")
    namespace, _ = run(
        block,
        source_ids=rng.integers(3, 37000, size=(2, 7)).astype("int32"),
        target_ids=np.concatenate([np.full((2, 1), 2, "int32"), target[:, :-1]], axis=1),
        labels=target,
    )
    model = namespace["model"]
    assert model.count_params() == 63_082_496  # "Table 3, 63.1M parameters"
    assert np.isfinite(model.history.history["loss"][0])
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1


@in_one_pass("torch", "the data path and fit's callbacks; each backend trains in test_training.py; eager steps need no compiling per batch length")
def test_the_data_and_training_blocks_train_on_their_files(parallel_files):
    sizes = {"37000": "400", '"base"': '"tiny"', "25000": "1024"}
    data, printed = run(smaller(python_block("docs/data.md", "make_dataset("), {**sizes, "epochs=10": "epochs=1, steps_per_epoch=2"}))
    assert "400 pairs" in printed
    assert (parallel_files / "runs" / "my-model" / "subword.model").is_file()
    assert np.isfinite(data["model"].history.history["loss"][0])

    block = smaller(
        python_block("docs/training.md", "training.Distribution()"),
        {**sizes, "train_steps=100000": "train_steps=4", "checkpoint_every=1000": "checkpoint_every=2", "[-5:]": "[-2:]"},
    )
    training, _ = run(block)
    assert int(keras.ops.convert_to_numpy(training["model"].optimizer.iterations)) == 4
    assert [path.name for path in sorted((parallel_files / "runs" / "base" / "checkpoints").glob("ckpt-*.keras"))] == [
        "ckpt-00000002.keras", "ckpt-00000004.keras",
    ]
    assert training["averaged"].count_params() == training["model"].count_params()


def test_the_decoding_blocks_run_on_a_tiny_model():
    model = kt.build_transformer("tiny", vocabulary_size=50)
    source_ids = np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32")
    namespace, _ = run(
        python_block("docs/decoding.md", "model.decode_step("),
        model=model, source_ids=source_ids, next_ids=np.full((2, 1), 2, "int32"), index=0,
    )
    # The first step's logits are the full model's at position 0.
    full = model({"source_ids": source_ids, "target_ids": np.full((2, 1), 2, "int32")})
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(namespace["logits"])[:, 0], keras.ops.convert_to_numpy(full)[:, 0],
        atol=1e-4,
    )

    # The search, on a step function that always favours id 3 (EOS).
    def step_fn(ids, index, state):
        logits = keras.ops.one_hot(keras.ops.full((keras.ops.shape(ids)[0],), 3), 10) * 5.0
        return logits, state

    namespace, _ = run(
        python_block("docs/decoding.md", "kt.decoding.beam_search("),
        kt=kt, step_fn=step_fn, initial_ids=np.full((2,), 2, "int32"), initial_state=np.zeros((2, 1), "float32"),
    )
    ids, scores = (keras.ops.convert_to_numpy(x) for x in (namespace["ids"], namespace["scores"]))
    assert ids.shape[:2] == (2, 4) and scores.shape == (2, 4)
    assert (ids[:, 0, 0] == 3).all()  # the best beam ends at once
    assert (np.diff(scores, axis=1) <= 0).all()  # best first


def test_the_decoding_guide_shows_the_readme_translator_block():
    """The README's block, which test_readme.py runs on the quick start's model."""
    line = 'kt.Translator.load("runs/quickstart")'
    assert python_block("docs/decoding.md", line) == python_block("README.md", line)
