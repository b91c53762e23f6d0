import glob
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.checks import check_count

import train_process
from conftest import in_one_pass, to_numpy

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_process.py")


def run(model_dir, steps, every, output, *extra, env=None, wait=True):
    command = [sys.executable, SCRIPT, str(model_dir), str(steps), str(every), str(output), *extra]
    environment = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), **(env or {}))
    if not wait:
        return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(np.load(output))


def weights(result):
    return [result[f"w{i}"] for i in range(sum(k.startswith("w") for k in result))]


def test_compile_model_uses_the_paper_setup():
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=20), warmup_steps=10)
    assert isinstance(model.optimizer, keras.optimizers.Adam)
    assert (model.optimizer.beta_1, model.optimizer.beta_2, model.optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert model.loss.label_smoothing == 0.1


def test_mixed_float16_gets_loss_scaling():
    model = kt.build_transformer("tiny", vocabulary_size=20, num_layers=1, dtype="mixed_float16")
    training.compile_model(model, warmup_steps=5)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    bfloat16 = kt.build_transformer("tiny", vocabulary_size=20, num_layers=1, dtype="mixed_bfloat16")
    assert not isinstance(training.compile_model(bfloat16).optimizer, keras.optimizers.LossScaleOptimizer)


@pytest.mark.skipif(
    keras.backend.backend() == "jax",
    reason="XLA:CPU has no float16 dot_general; mixed_float16 is a GPU setting",
)
def test_mixed_float16_trains():
    model = kt.build_transformer("tiny", vocabulary_size=20, num_layers=1, dtype="mixed_float16")
    training.compile_model(model, warmup_steps=5)
    inputs, labels = kt.data.reversal_task(64, 20, seed=0)
    history = model.fit(inputs, labels, batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][1] < history.history["loss"][0]


def test_a_nan_loss_stops_training_and_names_the_step(tmp_path):
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1))
    inputs, labels = kt.data.reversal_task(64, 16, seed=0)
    model.fit(inputs, labels, batch_size=16, epochs=1, verbose=0)  # 4 good steps
    kernel = model.decoder_blocks[0].feed_forward.inner_dense.kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    with pytest.raises(FloatingPointError, match=r"became nan at step 5\b"):
        model.fit(inputs, labels, batch_size=16, epochs=1, verbose=0,
                  callbacks=[training.StopOnNonFiniteLoss()])


def reversal_batches():
    import tensorflow as tf

    inputs, labels = kt.data.reversal_task(256, 16, seed=0)
    return tf.data.Dataset.from_tensor_slices((inputs, labels)).repeat().batch(16)


def saved_steps(directory):
    return [training.checkpoints.checkpoint_step(p) for p in training.list_checkpoints(directory)]


@pytest.mark.parametrize("entry", ["fit", "train_on_batch"])
def test_the_train_step_is_traced_once(entry):
    """Keras's TensorFlow trainer builds the optimizer inside the first traced
    step, and the variables made there make `tf.function` trace it again;
    the model builds its optimizer first. (Torch runs the step eagerly.)"""
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)
    runs = []
    train_step = model.train_step
    model.train_step = lambda *args: runs.append(1) or train_step(*args)
    inputs, labels = next(iter(reversal_batches().as_numpy_iterator()))
    for _ in range(3):
        if entry == "fit":
            model.fit(inputs, labels, batch_size=16, epochs=1, verbose=0)
        else:
            model.train_on_batch(inputs, labels)
    assert model.optimizer.built
    assert len(runs) == (3 if keras.backend.backend() == "torch" else 1)


def test_fit_stops_at_exactly_train_steps_with_a_last_checkpoint(tmp_path):
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)
    model = training.fit(model, reversal_batches(), tmp_path, 7, checkpoint_every=5, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == 7
    assert saved_steps(tmp_path / "checkpoints") == [5, 7]
    # Extended, a run goes back on its grid of checkpoints, then stops exactly.
    model = training.fit(model, reversal_batches(), tmp_path, 12, checkpoint_every=5, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == 12
    assert saved_steps(tmp_path / "checkpoints") == [5, 7, 10, 12]
    # Asked for no more than it has, it trains nothing.
    model = training.fit(model, reversal_batches(), tmp_path, 12, checkpoint_every=5, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == 12


@pytest.mark.skipif(
    keras.backend.backend() == "tensorflow",
    reason="Keras runs every step hook on the main thread under TensorFlow (it does not count that backend thread-safe), so there each call of the train function waits for its logs whatever the callbacks allow",
)
def test_fit_s_callbacks_leave_each_step_s_logs_to_keras_s_threads(tmp_path):
    """Under JAX and torch, Keras reads a step's logs back on the host, and
    runs the step hooks, on a thread of its own only where every callback
    allows it: one that does not makes each step wait for the device. So
    neither `fit`'s own callbacks (the loss check, the checkpoints, the
    TensorBoard logs) nor `ProgressLog` may; a probe that allows it sees the
    thread its hook runs in. The run still stops at exactly `train_steps`,
    and logs and checkpoints where it would."""
    import threading

    class Probe(keras.callbacks.Callback):
        async_safe = True
        threads = set()

        def on_train_batch_end(self, batch, logs=None):
            self.threads.add(threading.current_thread())

    lines = []
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)
    model = training.fit(
        model, reversal_batches(), tmp_path, 7, checkpoint_every=3, verbose=1,
        callbacks=[training.ProgressLog(7, every=2, log=lines.append), Probe()],
    )
    assert Probe.threads and threading.main_thread() not in Probe.threads
    assert int(to_numpy(model.optimizer.iterations)) == 7
    assert saved_steps(tmp_path / "checkpoints") == [3, 6, 7]
    assert [line.split(" |")[0] for line in lines] == [f"step {step}/7" for step in (2, 4, 6, 7)]


def test_progress_lines_come_in_step_order_when_keras_s_threads_run_hooks_out_of_order():
    """Keras's threads may reach the step hooks in any order: a hook waits
    for those of the calls before it, so no line is lost or out of place."""
    import threading

    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1))
    lines = []
    progress = training.ProgressLog(6, every=2, log=lines.append)
    progress.set_model(model)
    progress.on_train_begin()
    progress.on_epoch_begin(0)
    logs = {"loss": 1.0, "target_tokens": 10.0}
    early = threading.Thread(target=progress.on_train_batch_end, args=(3, logs))  # step 4 first
    early.start()
    early.join(timeout=0.5)
    assert early.is_alive() and lines == []  # waiting for the steps before it
    for batch in (0, 1, 2):
        progress.on_train_batch_end(batch, logs)
    early.join(timeout=10)
    progress.on_train_batch_end(4, logs)
    progress.on_train_batch_end(5, logs)
    assert [line.split(" |")[0] for line in lines] == ["step 2/6", "step 4/6", "step 6/6"]


def test_steps_per_execution_is_the_largest_power_of_two_dividing_every_interval():
    assert training.trainer.steps_per_execution(6000, 500, 100, 0) == 4
    assert training.trainer.steps_per_execution(6000, 1000, 1000, 3000) == 8
    assert training.trainer.steps_per_execution(7, 5, 100) == 1
    assert training.trainer.steps_per_execution(64, 32, most=16) == 16


def test_several_steps_a_call_checkpoint_log_and_end_where_one_step_a_call_does(tmp_path):
    """With 4 steps per call of the train function, Keras sees the logs and
    calls the callbacks once a call: the checkpoints, progress lines and the
    last step still fall on their steps, and the weights are those of one
    step a call. Counts that a call would overrun are refused. Keras's torch
    backend takes one step a call, and says so."""
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match="one step per call.*steps_per_execution=4"):
            training.compile_model(kt.build_transformer("tiny", vocabulary_size=16), steps_per_execution=4)
        return

    def train(model_dir, steps_per_execution):
        keras.utils.set_random_seed(0)
        model = training.compile_model(
            kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5,
            steps_per_execution=steps_per_execution,
        )
        lines = []
        progress = training.ProgressLog(12, every=4, log=lines.append)
        model = training.fit(model, reversal_batches(), model_dir, 12, checkpoint_every=8, callbacks=[progress], verbose=0)
        return model, lines

    batched, lines = train(tmp_path / "four", 4)
    assert int(to_numpy(batched.optimizer.iterations)) == 12
    assert saved_steps(tmp_path / "four" / "checkpoints") == [8, 12]
    assert [line.split(" |")[0] for line in lines] == ["step 4/12", "step 8/12", "step 12/12"]
    single, _ = train(tmp_path / "one", 1)
    for got, want in zip(batched.get_weights(), single.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), steps_per_execution=4)
    with pytest.raises(ValueError, match=r"must divide the batches of train_steps.*train_steps=10, checkpoint_every=8.*steps_per_execution=2"):
        training.fit(model, reversal_batches(), tmp_path / "ten", 10, checkpoint_every=8, verbose=0)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="counts the XLA programs JAX compiles for the step")
def test_under_jax_the_train_step_compiles_once_per_bucket_length(caplog):
    """Each batch shape is one XLA program of the train step: with
    `buckets=2`, two, whatever the number of steps, and none for more steps."""
    import jax

    from keras_transformer.data.batches import TokenBatches
    from keras_transformer.data.prepared import tokenize_pairs

    corpus = kt.data.builtin_corpus("valid", size=300)
    tokenizer = kt.data.SubwordTokenizer.train(corpus, 400)
    pairs = tokenize_pairs(corpus.sources, corpus.targets, tokenizer)
    batches = TokenBatches(pairs, 256, max_length=32, repeat=True, seed=0, buckets=2)
    shapes = {batches[step][1].shape[1] for step in range(12)}
    assert len(shapes) == 2  # both lengths come up in the first 12 batches
    model = training.compile_model(
        kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1), warmup_steps=5
    )

    def compiles():
        return sum("Compiling jit(train_step)" in record.getMessage() for record in caplog.records)

    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level("WARNING", logger="jax"):
            model.fit(batches, steps_per_epoch=12, epochs=1, verbose=0)
            assert compiles() == 2
            model.fit(batches, steps_per_epoch=12, epochs=1, verbose=0)
            assert compiles() == 2
    finally:
        jax.config.update("jax_log_compiles", False)


def test_validation_comes_in_at_most_two_lengths_whatever_the_training_buckets():
    """The test step compiles once per batch length: `train` validates on
    two lengths fitted to the validation pairs, not on the training's
    buckets (dozens at `bucket_step` 1.1), with every pair kept once."""
    from keras_transformer.training.run import validation_batches

    corpus = kt.data.builtin_corpus("valid", size=400)
    tokenizer = kt.data.SubwordTokenizer.train(corpus, 400)
    config = training.TrainingConfig(
        model_dir="unused", train_source=[], train_target=[], tokens_per_batch=512, bucket_step=1.1, max_tokens=128
    )
    by_step = kt.data.make_dataset(corpus, tokenizer, 512, max_length=128, bucket_step=1.1, shuffle=False)
    assert len({by_step[i][1].shape[1] for i in range(len(by_step))}) > 4  # what the training's buckets give
    for buckets, most in ((None, 2), (8, 2), (1, 1)):
        config.buckets = buckets
        batches = validation_batches(config, corpus, tokenizer)
        assert len({batches[i][1].shape[1] for i in range(len(batches))}) <= most
        real = sum(int((batches[i][1] != 0).sum()) for i in range(len(batches)))
        assert real == sum(int((by_step[i][1] != 0).sum()) for i in range(len(by_step)))


def test_a_write_cut_short_by_a_crash_neither_stops_nor_counts_in_a_resume(tmp_path):
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)
    model = training.fit(model, reversal_batches(), tmp_path, 5, checkpoint_every=5, verbose=0)
    checkpoints = tmp_path / "checkpoints"
    # What kill -9 inside a write leaves: a half-written file, under the
    # temporary name the writer uses and under the name older versions used.
    (checkpoints / ".partial-ckpt-00000010.keras").write_bytes(b"PK\x03\x04 cut short")
    (checkpoints / "ckpt-00000010.keras.partial.keras").write_bytes(b"PK\x03\x04 cut short")
    assert saved_steps(checkpoints) == [5]
    model = training.fit(model, reversal_batches(), tmp_path, 10, checkpoint_every=5, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == 10
    assert saved_steps(checkpoints) == [5, 10]
    assert not (checkpoints / ".partial-ckpt-00000010.keras").exists()


@pytest.mark.parametrize("name, value", [
    ("train_steps", float("nan")), ("train_steps", float("inf")), ("train_steps", 2.5), ("train_steps", True),
    ("checkpoint_every", 0), ("keep_checkpoints", -1),
])
def test_fit_refuses_counts_that_are_not_whole_positive_numbers(tmp_path, name, value):
    """NaN steps used to return the untrained model, with no checkpoint and no error."""
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)
    counts = {"train_steps": 5, "checkpoint_every": 5, "keep_checkpoints": 5} | {name: value}
    with pytest.raises(ValueError, match=rf"`{name}` must be a whole number >= 1. Received: {name}={re.escape(repr(value))}"):
        training.fit(model, reversal_batches(), tmp_path, verbose=0, **counts)
    assert not (tmp_path / "checkpoints").exists() or not os.listdir(tmp_path / "checkpoints")
    assert check_count(name, 2.0) == 2  # a whole float, as from JSON or arithmetic, is taken


def test_an_unwritable_checkpoint_directory_is_reported_before_training(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)
    with pytest.raises(PermissionError, match="Checkpoints cannot be written to .*checkpoints"):
        training.fit(model, reversal_batches(), tmp_path, 5, checkpoint_every=5, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == 0


def tiny_model():
    return training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory):
    """A run's directory at step 10, with checkpoints at steps 5 and 10: the
    tests of damaged checkpoints damage copies of it."""
    directory = tmp_path_factory.mktemp("ten_steps")
    training.fit(tiny_model(), reversal_batches(), directory, 10, checkpoint_every=5, verbose=0)
    return directory


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_an_unreadable_newest_checkpoint_is_skipped_with_a_warning(ten_steps, tmp_path, damage):
    shutil.copytree(ten_steps, tmp_path, dirs_exist_ok=True)
    checkpoints = tmp_path / "checkpoints"
    newest = checkpoints / "ckpt-00000010.keras"
    data = newest.read_bytes()
    newest.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x00" * 999, "empty": b""}[damage])
    with pytest.warns(UserWarning, match=r"Skipped 1 checkpoint.*ckpt-00000010\.keras \(.+\).*resuming from .*ckpt-00000005\.keras"):
        model = training.fit(tiny_model(), reversal_batches(), tmp_path, 15, checkpoint_every=5, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == 15
    # The damaged file is kept aside, and the steps it held are trained again.
    assert (checkpoints / ".unreadable-ckpt-00000010.keras").read_bytes() != data
    assert saved_steps(checkpoints) == [5, 10, 15]


def test_when_no_checkpoint_can_be_read_the_resume_stops_and_names_them(ten_steps, tmp_path):
    shutil.copytree(ten_steps, tmp_path, dirs_exist_ok=True)
    model = tiny_model()
    for path in training.list_checkpoints(tmp_path / "checkpoints"):
        with open(path, "r+b") as file:
            file.truncate(100)
    with pytest.raises(ValueError, match=r"None of the 2 checkpoints .* can be read.*ckpt-00000010\.keras \(.*ckpt-00000005\.keras"):
        training.fit(model, reversal_batches(), tmp_path, 15, checkpoint_every=5, verbose=0)
    # Nothing was moved: the next attempt says the same, and starts no new run.
    assert saved_steps(tmp_path / "checkpoints") == [5, 10]


def test_with_dropout_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    def train(model_dir, steps, seed=0):
        keras.utils.set_random_seed(seed)
        model = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1, dropout=0.3, attention_dropout=0.1), warmup_steps=5)
        return training.fit(model, reversal_batches(), model_dir, steps, checkpoint_every=4, verbose=0)

    whole = train(tmp_path / "whole", 12)
    train(tmp_path / "cut", 8)
    # The model a resumed run builds draws other seeds; the checkpoint's count.
    resumed = train(tmp_path / "cut", 12, seed=1)
    for got, want in zip(resumed.get_weights(), whole.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Dropout did act: without it, the weights differ.
    keras.utils.set_random_seed(0)
    plain = training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1, dropout=0.0), warmup_steps=5)
    plain = training.fit(plain, reversal_batches(), tmp_path / "plain", 12, checkpoint_every=4, verbose=0)
    assert not np.allclose(plain.get_weights()[0], whole.get_weights()[0], atol=1e-4)


# Fresh processes cost minutes, so the loop runs in one pass of the suite,
# the torch pass; tests/test_train_command.py kills a run at each of its
# file writes in turn. What it exercises, the files a
# killed run leaves behind and the next run's resume from them, is Keras
# saving and this package's code, the same on every backend; that a resumed
# run continues every backend's dropout streams exactly is the in-process
# test above, run in every pass.
@in_one_pass("torch", "checkpoint files and the resume from them; each backend's exact resume is tested in-process")
def test_kill_9_at_random_points_and_the_run_ends_as_an_uninterrupted_one(tmp_path):
    steps, every = 60, 2  # a checkpoint write every other step
    arguments = ("--dropout", "0.2")
    # The uninterrupted reference needs no process of its own: the same run, here.
    reference = train_process.train(tmp_path / "whole", steps, every, dropout=0.2)
    checkpoints = tmp_path / "killed" / "checkpoints"

    def newest_step():
        return max(saved_steps(checkpoints), default=0)

    def wait_for(condition, process):
        deadline = time.time() + 120
        while not condition():
            assert process.poll() is None, f"the run ended before it was killed: {process.communicate()[1][-3000:]}"
            assert time.time() < deadline, "the run made no progress"
            time.sleep(0.002)

    rng = random.Random(0)
    moments = ["inside a checkpoint write", "between steps", "while starting or restoring"]
    kills, partial_left = {moment: 0 for moment in moments}, 0
    for attempt in range(3):  # a kill at each moment
        moment = moments[attempt % 3]
        process = run(tmp_path / "killed", steps, every, tmp_path / "killed.npz", *arguments, wait=False)
        if moment == "inside a checkpoint write":
            wait_for(lambda: glob.glob(str(checkpoints / ".partial-*")), process)
        elif moment == "between steps":
            start = newest_step()
            wait_for(lambda: newest_step() > start, process)
            time.sleep(rng.uniform(0, 0.3))
        else:  # the first seconds: imports, building, restoring
            time.sleep(rng.uniform(0, 6))
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
        assert process.returncode == -signal.SIGKILL, f"the run failed before the kill: {stderr.decode()[-3000:]}"
        kills[moment] += 1
        partial_left += bool(glob.glob(str(checkpoints / ".partial-*")))
    assert sum(kills.values()) == 3 and partial_left >= 1, (kills, partial_left)
    assert newest_step() < steps

    final = run(tmp_path / "killed", steps, every, tmp_path / "killed.npz", *arguments)
    assert final["step"] == steps
    for got, want in zip(weights(final), weights(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_validation_bleu_after_a_resume_translates_with_the_restored_model(tmp_path):
    def new_model():
        return training.compile_model(kt.build_transformer("tiny", vocabulary_size=16, num_layers=1), warmup_steps=5)

    translated_with = []

    class RecordingTranslator:
        def __init__(self, model, tokenizer, **config):
            self.model, self.tokenizer, self.config = model, tokenizer, config

        def get_config(self):
            return self.config

        def translate(self, sources):
            translated_with.append(self.model)
            return ["ein Satz"] * len(sources)

    training.fit(new_model(), reversal_batches(), tmp_path, 5, checkpoint_every=5, verbose=0)
    fresh = new_model()  # as a resumed run builds it, before `fit` restores the checkpoint
    callback = training.ValidationBLEU(RecordingTranslator(fresh, None, beam_size=1), ["a"], ["ein Satz"], log=lambda _: None)
    trained = training.fit(fresh, reversal_batches(), tmp_path, 10, checkpoint_every=5, callbacks=[callback], verbose=0)
    assert trained is not fresh
    assert translated_with and all(model is trained for model in translated_with)
    assert callback.translator.config == {"beam_size": 1}


def test_averaged_weights_are_the_element_wise_mean(tmp_path):
    model = kt.build_transformer("tiny", vocabulary_size=20, num_layers=1)
    paths, snapshots = [], []
    for i in range(3):
        model.set_weights([w + i * 0.5 + np.random.default_rng(i).normal(size=w.shape).astype(w.dtype) for w in model.get_weights()])
        paths.append(str(tmp_path / f"ckpt-{i:08d}.keras"))
        model.save(paths[-1])
        snapshots.append(model.get_weights())
    averaged = training.average_checkpoints(paths)
    for got, *tensors in zip(averaged.get_weights(), *snapshots):
        np.testing.assert_allclose(got, np.mean(tensors, axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match=r"Received: \[\]"):
        training.average_checkpoints([])


# The checkpoint is of a model that never trained, so its optimizer holds
# only the step counter, which Keras warns about when it loads it.
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_a_model_dir_of_another_model_is_refused(tmp_path):
    saver = training.SaveCheckpoints(tmp_path / "checkpoints")
    small = training.compile_model(kt.build_transformer("tiny", vocabulary_size=20, num_layers=1))
    saver.set_model(small)
    saver.on_epoch_end(0)
    other = training.compile_model(kt.build_transformer("tiny", vocabulary_size=20, num_layers=2))
    dataset = __import__("tensorflow").data.Dataset.from_tensors(({"source_ids": np.ones((2, 3), "int32"), "target_ids": np.ones((2, 3), "int32")}, np.ones((2, 3), "int32"))).repeat()
    with pytest.raises(ValueError, match=r"holds checkpoints of a different model.*num_layers=1 vs 2"):
        training.fit(other, dataset, tmp_path, 5, checkpoint_every=5)


@pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="keras.distribution.DataParallel is the JAX backend's engine"
)
def test_jax_data_parallel_over_two_devices_matches_one_device(tmp_path):
    """Updates of 2 batches each (`accumulate=2`: Keras's accumulation
    inside the step JAX shards), on one device and on two."""
    single = train_process.train(tmp_path / "one", 6, 3, accumulate=2)  # one device: this process's
    double = run(
        tmp_path / "two", 6, 3, tmp_path / "two.npz", "--devices", "2", "--accumulate", "2",
        env={"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"},
    )
    assert int(double["replicas"]) == 2 and int(double["step"]) == int(single["step"]) == 6
    assert len(double["losses"]) == 12  # batches
    # The losses, not the weights: the attention keys' biases, whose
    # gradient is zero but for rounding, move by Adam's whole step (epsilon
    # 1e-9) in whichever direction each reduction order rounds to
    # (test_accumulation.py).
    np.testing.assert_allclose(double["losses"], single["losses"], rtol=1e-4)


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="MirroredStrategy is the TensorFlow backend's engine"
)
def test_mirrored_strategy_over_two_devices_matches_one_device(tmp_path):
    """Updates of 2 batches each (`accumulate=2`, whose choice between
    accumulating and updating runs across the replicas:
    keras_private.ReplicaAccumulation). Each replica averages the loss over
    its own tokens. With equal token counts per replica (sequences of one
    length) that is the global mean, and two replicas must match one device
    to 1e-4. With unequal counts they differ by the spread of the counts
    (0.3% after 5 steps here)."""
    single = train_process.train(tmp_path / "one", 6, 3, fixed_length=True, accumulate=2)  # this process's device
    double = run(
        tmp_path / "two", 6, 3, tmp_path / "two.npz", "--devices", "2", "--fixed-length", "--accumulate", "2"
    )
    assert int(double["replicas"]) == 2 and int(double["step"]) == int(single["step"]) == 6
    assert len(double["losses"]) == 12  # batches
    np.testing.assert_allclose(double["losses"], single["losses"], rtol=1e-4)
    # Resumed from its checkpoint at update 3, the run goes on over both
    # devices, to the uninterrupted run's weights.
    shutil.copytree(tmp_path / "two", tmp_path / "resumed")
    (tmp_path / "resumed" / "checkpoints" / "ckpt-00000006.keras").unlink()
    resumed = run(
        tmp_path / "resumed", 6, 3, tmp_path / "resumed.npz", "--devices", "2", "--fixed-length", "--accumulate", "2"
    )
    np.testing.assert_allclose(resumed["losses"], double["losses"][6:], rtol=1e-5)
    for a, b in zip(weights(resumed), weights(double), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def free_ports(count):
    """Ports on 127.0.0.1 that nothing listens on now, as strings."""
    ports = []
    for _ in range(count):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(str(probe.getsockname()[1]))
    return ports


LEAST = """
import json, os, sys
index, ports, value = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
os.environ["TF_CONFIG"] = json.dumps(
    {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
)
from keras_transformer.training import Distribution
distribution = Distribution()
print(distribution.processes, distribution.least(value))
"""


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="MultiWorkerMirroredStrategy is the TensorFlow backend's engine",
)
def test_two_workers_agree_on_the_least_of_their_steps():
    """What workers resuming together agree on: the newest step both have."""
    ports = free_ports(2)
    workers = [
        subprocess.Popen([sys.executable, "-c", LEAST, str(i), ",".join(ports), str(value)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, value in enumerate((8, 6))
    ]
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr[-3000:]
        assert stdout.split() == ["2", "6"], stdout


@pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="only the torch backend is limited to one device"
)
def test_torch_refuses_several_devices():
    with pytest.raises(ValueError, match="trains on one device"):
        training.Distribution(devices=["cpu", "cpu"])
