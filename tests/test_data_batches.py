import itertools
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
from keras_transformer.data.batches import aligned_rows
from keras_transformer.data.batches import fitted_bucket_lengths
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


def padded_tokens(histogram, lengths):
    """Padded tokens per row summed over pairs, each in its shortest bucket."""
    present = np.flatnonzero(histogram)
    return int((histogram[present] * np.asarray(lengths)[np.searchsorted(lengths, present)]).sum())


def test_fitted_bucket_lengths_pad_least_of_all_choices():
    rng = np.random.default_rng(0)
    for _ in range(30):
        histogram = np.zeros(13, np.int64)
        present = rng.choice(np.arange(1, 13), size=rng.integers(1, 9), replace=False)
        histogram[present] = rng.integers(1, 50, len(present))
        count = int(rng.integers(1, 5))
        lengths = fitted_bucket_lengths(histogram, count)
        longest = int(present.max())
        assert len(lengths) <= count and lengths == sorted(set(lengths)) and lengths[-1] == longest
        # Every choice of at most `count` lengths that covers the longest pair.
        best = min(
            padded_tokens(histogram, sorted(chosen) + [longest])
            for k in range(count)
            for chosen in itertools.combinations(range(1, longest), k)
        )
        assert padded_tokens(histogram, lengths) == best
    with pytest.raises(ValueError, match="empty histogram"):
        fitted_bucket_lengths(np.zeros(5, np.int64), 3)


def test_fitted_buckets_pad_less_than_as_many_geometric_ones(pairs):
    geometric = TokenBatches(pairs, 512, max_length=64, bucket_step=1.5, seed=0)
    fitted = TokenBatches(pairs, 512, max_length=64, buckets=len(geometric.lengths), seed=0)
    assert len(fitted.lengths) <= len(geometric.lengths)

    def real_fraction(batches):
        real = padded = 0
        for k in range(len(batches)):
            ids, _ = batches[k]
            real += int((ids["source_ids"] != 0).sum())
            padded += ids["source_ids"].size
        return real / padded

    assert real_fraction(fitted) > real_fraction(geometric)
    for k in range(len(fitted)):  # each pair in the shortest bucket that holds it
        members, bucket = fitted.pair_indices(k)
        lengths = pairs.pair_lengths().astype(int)[members]
        assert lengths.max() <= fitted.lengths[bucket] and (bucket == 0 or lengths.min() > fitted.lengths[bucket - 1])
    with pytest.raises(ValueError, match=r"`buckets` must be an integer from 1 to 64, or None. Received: buckets=0"):
        TokenBatches(pairs, 512, buckets=0)


def test_aligned_rows_make_tokens_a_multiple_of_64_where_that_costs_few_rows():
    # The base recipe's lengths on Multi30k, 25,000 tokens: [462, 54] -> [448, 54].
    assert aligned_rows(462, 54) == 448 and aligned_rows(1136, 22) == 1120
    for rows in range(1, 3000, 7):
        for length in (2, 9, 15, 22, 54, 56, 64, 129, 256):
            aligned = aligned_rows(rows, length)
            assert rows - aligned <= rows / 32
            multiple = 64
            while multiple > 1 and (aligned * length) % multiple:
                multiple //= 2
            # No power of two above the one reached was in reach at that cost.
            for larger in (2 * multiple, 4 * multiple):
                if larger <= 64:
                    step = larger // np.gcd(larger, length)
                    assert rows - rows // step * step > rows / 32 or rows // step == 0
    assert aligned_rows(462, 54, alignment=1) == 462


def test_full_batches_are_aligned_per_replica_within_the_budget(pairs):
    for multiple in (1, 2):
        aligned = TokenBatches(pairs, 4000, max_length=64, seed=0, batch_multiple=multiple)
        plain = TokenBatches(pairs, 4000, max_length=64, seed=0, batch_multiple=multiple, token_alignment=1)
        per_replica = aligned.batch_sizes // multiple
        assert (aligned.batch_sizes % multiple == 0).all() and (aligned.batch_sizes <= plain.batch_sizes).all()
        assert (plain.batch_sizes == np.maximum(multiple, 4000 // plain.lengths // multiple * multiple)).all()
        assert (per_replica * aligned.lengths % 8 == 0).sum() > (plain.batch_sizes // multiple * plain.lengths % 8 == 0).sum()
        assert (aligned.batch_sizes >= plain.batch_sizes * 31 / 32).all()
        ids, labels = aligned[0]
        assert labels.shape[0] in aligned.batch_sizes and labels.size <= 4000
    with pytest.raises(ValueError, match=r"`token_alignment` must be an integer >= 1. Received: token_alignment=0"):
        TokenBatches(pairs, 512, token_alignment=0)


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


@in_one_pass("jax", "the batch plan and training.fit's resume are NumPy and Python; each backend's exact resume is tested in-process in every pass")
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
