"""Every file is written under a temporary name and renamed into place
(keras_transformer/files.py): the old file or the new one, never a torn
one, and a failed write names its file and leaves nothing behind."""

import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from keras_transformer.files import PARTIAL_PREFIX
from keras_transformer.files import CannotWrite
from keras_transformer.files import atomic_path
from keras_transformer.files import write_atomically

from conftest import in_one_pass


def test_a_write_replaces_the_file_whole_or_not_at_all(tmp_path):
    path = tmp_path / "settings.json"
    write_atomically(path, '{"beam_size": 4}')
    with pytest.raises(RuntimeError, match="cut short"):
        with atomic_path(path) as temporary:
            with open(temporary, "w") as file:
                file.write('{"beam_')
            raise RuntimeError("cut short")
    assert path.read_text() == '{"beam_size": 4}'
    assert os.listdir(tmp_path) == ["settings.json"]
    write_atomically(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert os.listdir(tmp_path) == ["settings.json"]


def test_the_next_write_clears_what_a_killed_one_left(tmp_path):
    (tmp_path / f"{PARTIAL_PREFIX}model.keras.x1y2.keras").write_bytes(b"half a model")
    (tmp_path / f"{PARTIAL_PREFIX}other.json.x1y2.json").write_bytes(b"{")  # another file's
    with atomic_path(tmp_path / "model.keras") as temporary:
        assert os.path.dirname(temporary) == str(tmp_path) and temporary.endswith(".keras")
        with open(temporary, "wb") as file:
            file.write(b"a model")
    assert sorted(os.listdir(tmp_path)) == [f"{PARTIAL_PREFIX}other.json.x1y2.json", "model.keras"]


@in_one_pass("jax", "keras_transformer.files writes with os calls, the same under every backend")
def test_a_write_past_the_space_left_names_the_file_and_leaves_no_partial(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) fails writes as a full disk does."""
    path = tmp_path / "subword.model"
    path.write_bytes(b"the old vocabulary")
    script = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, do not kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from keras_transformer.files import write_atomically, CannotWrite
        try:
            write_atomically({str(path)!r}, b"x" * 100_000)
        except CannotWrite as error:
            print(error)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"Cannot write {path}: File too large"
    assert path.read_bytes() == b"the old vocabulary"
    assert os.listdir(tmp_path) == ["subword.model"]


def test_a_folder_that_cannot_take_the_file_is_named(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(CannotWrite, match=f"Cannot write {tmp_path / 'taken' / 'x.json'}: "):
        write_atomically(tmp_path / "taken" / "x.json", "{}")


# Run in a process of its own: at the N-th file opened for writing under
# FOLDER it leaves that file as the open would (created, emptied) and kills
# the process, as a kill inside that write would.
KILL_AT_WRITE = """
import os, signal, sys
folder, count = os.path.realpath(sys.argv[1]), [int(sys.argv[2])]

def kill_at_write(event, args):
    if event != "open" or not isinstance(args[0], str) or not (args[2] & (os.O_WRONLY | os.O_RDWR)):
        return
    if os.path.realpath(args[0]).startswith(folder + os.sep):
        count[0] -= 1
        if count[0] == 0:
            open(args[0], "wb").close()
            os.kill(os.getpid(), signal.SIGKILL)
"""


# A save opens 12 files for writing (3 a file: create, write, sync): kills
# in model.keras and translator.json, which were written in place.
@in_one_pass("torch", "Keras's .keras saving and file renames")
@pytest.mark.parametrize("write", [1, 11])
def test_a_kill_inside_a_translator_save_leaves_the_saved_translator_whole(tmp_path, write):
    """A kill inside the final save used to leave an empty subword.model,
    model.keras or translator.json: the run's only copy of its vocabulary."""
    import keras_transformer as kt

    tokenizer = kt.data.SubwordTokenizer.train(kt.data.builtin_corpus("train", size=200, seed=0), 400)
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1)
    kt.Translator(model, tokenizer, beam_size=2).save(tmp_path / "run")
    script = KILL_AT_WRITE + textwrap.dedent("""
        import keras_transformer as kt
        translator = kt.Translator.load(folder, beam_size=3)
        sys.addaudithook(kill_at_write)
        translator.save(folder)
    """)
    killed = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run"), str(write)], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    loaded = kt.Translator.load(tmp_path / "run")
    assert loaded.tokenizer.fingerprint() == tokenizer.fingerprint()
    assert loaded.beam_size == 2  # the old settings, whole
    for got, want in zip(loaded.model.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_a_keras_file_saved_through_disk_holds_keras_s_own_files_and_loads_exactly(tmp_path):
    """`save_keras_model` writes the weights to a folder, then archives it:
    the same members as Keras's own `model.save`, the same weights on
    loading, and no folder left behind."""
    import keras

    import keras_transformer as kt
    from keras_transformer.files import save_keras_model

    model = kt.build_transformer("tiny", vocabulary_size=40, num_layers=1)
    save_keras_model(model, str(tmp_path / "ours.keras"))
    model.save(tmp_path / "keras.keras")
    with zipfile.ZipFile(tmp_path / "ours.keras") as ours, zipfile.ZipFile(tmp_path / "keras.keras") as theirs:
        assert sorted(ours.namelist()) == sorted(theirs.namelist())
        assert ours.read("config.json") == theirs.read("config.json")
    loaded = keras.saving.load_model(tmp_path / "ours.keras", compile=False)
    assert [w.path for w in loaded.weights] == [w.path for w in model.weights]
    for got, want in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want))
    assert sorted(os.listdir(tmp_path)) == ["keras.keras", "ours.keras"]


def test_the_next_write_clears_the_folder_a_killed_keras_save_left(tmp_path):
    left = tmp_path / f"{PARTIAL_PREFIX}model.keras.x1y2.keras.z3" / "model"
    left.mkdir(parents=True)
    (left / "model.weights.h5").write_bytes(b"half the weights")
    with atomic_path(tmp_path / "model.keras") as temporary:
        with open(temporary, "wb") as file:
            file.write(b"a model")
    assert os.listdir(tmp_path) == ["model.keras"]


def test_a_keras_file_the_disk_has_no_room_for_is_refused_before_hdf5_writes(tmp_path, monkeypatch):
    """HDF5 ends the process when a write of its file fails (a full disk),
    so the room is checked first: the error names the file, and nothing is
    left (tests/test_train_command.py fills a disk through a file-size limit)."""
    import shutil

    import keras_transformer as kt
    from keras_transformer.files import save_keras_model

    model = kt.build_transformer("tiny", vocabulary_size=40, num_layers=1)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=100_000))
    with pytest.raises(CannotWrite, match=f"Cannot write {tmp_path / 'model.keras'}: No space left on device"):
        save_keras_model(model, tmp_path / "model.keras")
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    save_keras_model(model, tmp_path / "model.keras")
    assert os.listdir(tmp_path) == ["model.keras"]
