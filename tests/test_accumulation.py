"""Gradient accumulation (`--accumulate N`): an update of N batches is the
update of one batch holding their sentences, and a run resumed after a
crash inside an update ends as an uninterrupted one."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.data import TokenBatches
from keras_transformer.data.batches import BOS_ID
from keras_transformer.data.batches import EOS_ID
from keras_transformer.data.prepared import TokenizedPairs

from conftest import in_one_pass
from conftest import to_numpy

VOCABULARY = 50
MAX_LENGTH = 24
N = 4  # batches per update
UPDATES = 3


@pytest.fixture(scope="module")
def pairs():
    """Pairs of random ids, 3 to 22 long, so that batches of two bucket
    lengths hold different numbers of target tokens."""
    rng = np.random.default_rng(0)
    sides = {}
    for side in ("source", "target"):
        lengths = rng.integers(3, MAX_LENGTH - 1, size=120).astype(np.uint16)
        ids = rng.integers(3, VOCABULARY, size=int(lengths.sum())).astype(np.uint16)
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        sides |= {f"{side}_ids": ids, f"{side}_offsets": offsets, f"{side}_lengths": lengths}
    return TokenizedPairs(**sides, vocabulary_size=VOCABULARY)


def batches(pairs, accumulate):
    return TokenBatches(
        pairs, 192, max_length=MAX_LENGTH, buckets=2, shuffle=True, repeat=True, seed=3,
        token_alignment=1, accumulate=accumulate,
    )


def one_batch_of(pairs, members):
    """The pairs `members` in one batch, padded to `MAX_LENGTH`."""
    rows = len(members)
    source = np.zeros((rows, MAX_LENGTH), np.int32)
    target = np.zeros((rows, MAX_LENGTH), np.int32)
    labels = np.zeros((rows, MAX_LENGTH), np.int32)
    for row, pair in enumerate(members):
        s = pairs.source_ids[pairs.source_offsets[pair] : pairs.source_offsets[pair + 1]]
        t = pairs.target_ids[pairs.target_offsets[pair] : pairs.target_offsets[pair + 1]]
        source[row, : len(s) + 1] = [*s, EOS_ID]
        target[row, : len(t) + 1] = [BOS_ID, *t]
        labels[row, : len(t) + 1] = [*t, EOS_ID]
    return {"source_ids": source, "target_ids": target}, labels


def new_model(accumulate, dropout=0.0):
    keras.utils.set_random_seed(7)
    model = kt.build_transformer("tiny", vocabulary_size=VOCABULARY, num_layers=1, dropout=dropout, attention_dropout=dropout)
    # Rates of 1.6e-3 to 4.7e-3 (the paper's peak is 7e-4) move the weights
    # by far more than the tolerance. Adam's epsilon is above float32's
    # rounding of the gradients: its first steps are lr * g / (|g| +
    # epsilon), so with the paper's 1e-9 a gradient that is zero but for
    # rounding (the attention keys' bias: softmax ignores a shift) moves
    # its weight by up to lr, in whichever direction the rounding says.
    model = training.compile_model(
        model, warmup_steps=4, learning_rate_scale=0.1, accumulate=accumulate, epsilon=1e-6
    )
    return model


def test_an_update_of_n_batches_is_the_update_of_one_batch_of_their_sentences(pairs):
    accumulated = batches(pairs, N)
    tokens = [int((accumulated[k][1] != 0).sum()) for k in range(N * UPDATES)]
    assert len(set(tokens)) > 1 and len({accumulated[k][1].shape[1] for k in range(N * UPDATES)}) == 2
    # Each batch's loss weight is N times its share of the update's tokens.
    weights = [float(accumulated[k][2][0, 0]) for k in range(N * UPDATES)]
    for update in range(UPDATES):
        group = slice(update * N, update * N + N)
        np.testing.assert_allclose(weights[group], N * np.array(tokens[group]) / sum(tokens[group]), rtol=1e-6)

    model = new_model(N)
    model.fit(accumulated, steps_per_epoch=N * UPDATES, epochs=1, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == UPDATES

    reference = new_model(1)
    for update in range(UPDATES):
        members = np.concatenate([accumulated.pair_indices(k)[0] for k in range(update * N, update * N + N)])
        reference.train_on_batch(*one_batch_of(pairs, members))
    assert int(to_numpy(reference.optimizer.iterations)) == UPDATES

    start = new_model(1).get_weights()
    moved = max(float(np.abs(a - b).max()) for a, b in zip(reference.get_weights(), start))
    assert moved > 1e-3
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@in_one_pass("torch", "checkpoints where updates end and the resume's batches are training.fit's, the same under every backend; each backend's accumulated update is the test above")
def test_a_run_that_crashed_inside_an_update_resumes_to_the_uninterrupted_weights(pairs, tmp_path):
    class Crash(keras.callbacks.Callback):
        """Ends the run between the second and third batches of update 2."""

        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen == N + 2:
                raise KeyboardInterrupt

    steps, every = 2, 1
    whole = training.fit(new_model(N, 0.1), batches(pairs, N), tmp_path / "whole", steps, checkpoint_every=every, verbose=0)
    with pytest.raises(KeyboardInterrupt):
        training.fit(new_model(N, 0.1), batches(pairs, N), tmp_path / "crashed", steps, checkpoint_every=every,
                     callbacks=[Crash()], verbose=0)
    names = sorted(path.name for path in (tmp_path / "crashed" / "checkpoints").glob("ckpt-*.keras"))
    assert names == ["ckpt-00000001.keras"]  # at the end of update 1
    resumed = training.fit(new_model(N, 0.1), batches(pairs, N), tmp_path / "crashed", steps, checkpoint_every=every, verbose=0)
    assert int(to_numpy(resumed.optimizer.iterations)) == steps
    for got, want in zip(resumed.get_weights(), whole.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_batches_weighed_for_another_update_are_refused(pairs, tmp_path):
    with pytest.raises(ValueError, match="update of 4 batches .* updates of 2"):
        training.fit(new_model(N), batches(pairs, 2), tmp_path, 2, checkpoint_every=1, verbose=0)
    with pytest.raises(ValueError, match="accumulate"):
        TokenBatches(pairs, 192, max_length=MAX_LENGTH, accumulate=0)
    with pytest.raises(ValueError, match="accumulate"):
        training.compile_model(kt.build_transformer("tiny", vocabulary_size=VOCABULARY), accumulate=0)


def test_a_keras_without_the_pieces_of_accumulation_over_replicas_is_refused_clearly(monkeypatch):
    """Over several TensorFlow replicas the update runs Keras's optimizer
    methods one by one (keras_private.ReplicaAccumulation); where a Keras
    lacks one, compiling says so, and accumulate=1 still compiles."""
    from keras_transformer.backend import keras_private
    from keras_transformer.training import trainer

    monkeypatch.setattr(trainer, "_replicas", lambda model: 2)
    monkeypatch.setattr(keras_private, "_ACCUMULATION_PIECES", ("_backend_apply_gradients", "_no_such_method"))
    model = kt.build_transformer("tiny", vocabulary_size=VOCABULARY, num_layers=1)
    with pytest.raises(ValueError, match=r"accumulate=2 over 2 TensorFlow replicas needs Keras's optimizer methods"):
        training.compile_model(model, accumulate=2)
    assert training.compile_model(model, accumulate=1).optimizer.gradient_accumulation_steps is None


def test_a_run_of_several_fit_calls_with_moving_averages_goes_on_from_the_trained_weights(pairs, tmp_path):
    """Keras's `fit` ends by putting the weights' moving averages (`use_ema`)
    into the model; `training.fit`'s next call must start from the trained
    weights, which the checkpoint between them holds."""

    class StartingWeights(keras.callbacks.Callback):
        seen = []

        def on_train_begin(self, logs=None):
            self.seen.append([to_numpy(v) for v in self.model.trainable_variables])

    model = kt.build_transformer("tiny", vocabulary_size=VOCABULARY, num_layers=1)
    training.compile_model(model, warmup_steps=4, accumulate=2, ema=0.5)
    starts = StartingWeights()
    # Steps 0-3, then 3-5: two calls of Keras's fit.
    trained = training.fit(model, batches(pairs, 2), tmp_path, 5, checkpoint_every=3, callbacks=[starts], verbose=0)
    assert len(starts.seen) == 2
    checkpoint = keras.saving.load_model(tmp_path / "checkpoints" / "ckpt-00000003.keras")
    saved = [to_numpy(v) for v in checkpoint.trainable_variables]
    for got, want in zip(starts.seen[1], saved, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert any(np.abs(w - to_numpy(a)).max() > 1e-4 for w, a in zip(saved, checkpoint.optimizer.moving_averages(), strict=True))
    # At its end, Keras's semantics: the model holds the moving averages.
    final = keras.saving.load_model(tmp_path / "checkpoints" / "ckpt-00000005.keras")
    for got, average in zip(trained.trainable_variables, final.optimizer.moving_averages()):
        np.testing.assert_allclose(to_numpy(got), to_numpy(average), atol=1e-6)
