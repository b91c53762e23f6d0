import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from keras_transformer.checks import check_ids_on_host
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import TokenBatches
from keras_transformer.data import builtin_corpus
from keras_transformer.data.prepared import tokenize_pairs
from keras_transformer.training.checkpoints import checkpoint_step
from keras_transformer.training.checkpoints import list_checkpoints

from conftest import in_one_pass

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_batches_process.py")


@pytest.fixture(scope="module")
def pairs():
    corpus = builtin_corpus("train", size=500, seed=5)
    tokenizer = SubwordTokenizer.train(corpus, vocabulary_size=400)
    sources, targets = zip(*corpus)
    return tokenize_pairs(sources, targets, tokenizer)


def test_batch_k_is_the_same_for_every_instance_and_every_start(pairs):
    batches = TokenBatches(pairs, 512, repeat=True, seed=3)
    per_epoch = batches.batches_per_epoch
    for step in (0, 5, per_epoch - 1, per_epoch, 3 * per_epoch + 2):
        again = TokenBatches(pairs, 512, repeat=True, seed=3)[step]
        resumed = batches.starting_at(step - 1)[1]
        for other in (again, resumed):
            np.testing.assert_array_equal(batches[step][0]["source_ids"], other[0]["source_ids"])
            np.testing.assert_array_equal(batches[step][1], other[1])
    # Each epoch holds every pair, and its batches are full: a bucket's last
    # batch takes the bucket's first pairs again instead of rows of padding.
    epoch = [batches.pair_indices(k) for k in range(per_epoch, 2 * per_epoch)]
    assert sorted(set(i for members, _ in epoch for i in members)) == list(range(len(pairs)))
    assert all(len(members) == batches.batch_sizes[bucket] for members, bucket in epoch)
    assert all((labels != 0).any(1).all() for _, labels in (batches[k] for k in range(per_epoch)))
    once = TokenBatches(pairs, 512, seed=3)  # one epoch: each pair once, then padding
    assert sorted(i for k in range(len(once)) for i in once.pair_indices(k)[0]) == list(range(len(pairs)))


def test_shards_of_a_batch_make_up_the_batch(pairs):
    whole = TokenBatches(pairs, 512, repeat=True, seed=1, batch_multiple=2)
    shards = [TokenBatches(pairs, 512, repeat=True, seed=1, batch_multiple=2, shard=(i, 2)) for i in range(2)]
    for step in range(12):
        parts = [shard[step] for shard in shards]
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), whole[step][1])
        np.testing.assert_array_equal(
            np.concatenate([p[0]["target_ids"] for p in parts]), whole[step][0]["target_ids"]
        )
    with pytest.raises(ValueError, match=r"count must divide batch_multiple. Received: shard=\(0, 2\), batch_multiple=1"):
        TokenBatches(pairs, 512, shard=(0, 2))


def test_ids_checked_on_host_against_the_vocabulary(pairs):
    batches = TokenBatches(pairs, 512)
    _, checked = check_ids_on_host(batches, pairs.vocabulary_size)
    if checked:  # JAX checks data on the host, before its compiled steps
        with pytest.raises(ValueError, match=r"ids of a vocabulary of 400 pieces, but the model's vocabulary_size is 300"):
            check_ids_on_host(batches, 300)


def run(model_dir, steps, log, weights, **options):
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(model_dir), str(steps), "4", str(log), str(weights)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options,
    )


def served(log):
    return [(int(step), digest) for step, digest in (line.split() for line in log.read_text().splitlines())]


@in_one_pass("tensorflow", "the batch plan and training.fit's resume are NumPy and Python; each backend's exact resume is tested in-process in every pass")
def test_a_killed_run_resumes_on_the_batches_an_uninterrupted_run_sees(tmp_path):
    steps = 24
    killed = run(tmp_path / "run", steps, tmp_path / "killed.log", tmp_path / "unused.npz")
    # Killed after its first checkpoint (every 4 steps), before its last.
    checkpoints = tmp_path / "run" / "checkpoints"
    deadline = time.time() + 600
    while not list_checkpoints(checkpoints) and killed.poll() is None:
        assert time.time() < deadline
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    restart = checkpoint_step(list_checkpoints(checkpoints)[-1])
    assert 4 <= restart < steps
    resumed = run(tmp_path / "run", steps, tmp_path / "resumed.log", tmp_path / "resumed.npz")
    uninterrupted = run(tmp_path / "whole", steps, tmp_path / "whole.log", tmp_path / "whole.npz")
    for process in (resumed, uninterrupted):
        _, errors = process.communicate(timeout=600)
        assert process.returncode == 0, errors.decode()[-3000:]

    reference = dict(served(tmp_path / "whole.log"))
    assert set(range(steps)) <= set(reference)
    for log in ("killed.log", "resumed.log"):
        for step, digest in served(tmp_path / log):
            assert digest == reference[step], f"{log}: batch {step} differs"
    # The resumed run starts at its checkpoint's step and goes on in order,
    # without replaying the batches before it.
    order = list(dict.fromkeys(step for step, _ in served(tmp_path / "resumed.log")))
    assert order[: steps - restart] == list(range(restart, steps))
    whole, again = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "resumed.npz")
    for name in whole.files:
        np.testing.assert_array_equal(whole[name], again[name])
