"""Dropout drawn from seeded streams (layers/dropout.py, backend/random.py)."""

import keras
import numpy as np
import pytest
from conftest import to_numpy
from conftest import torch_operations

import keras_transformer as kt
from keras_transformer import layers
from keras_transformer.backend import random as backend_random


def _inputs():
    return np.linspace(-2.0, 2.0, 3 * 7 * 16, dtype="float32").reshape(3, 7, 16)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_masks_are_keras_dropout_s_from_the_same_seed(rate):
    """Call after call, our dropout drops what Keras's own dropout with the
    same seed drops, and both streams stand at the same position after."""
    ours = layers.Dropout(rate, seed=11)
    keras_s = keras.layers.Dropout(rate, seed=11)
    inputs = _inputs()
    masks = []
    for _ in range(3):
        expected = to_numpy(keras_s(inputs, training=True))
        dropped = to_numpy(ours(inputs, training=True))
        np.testing.assert_array_equal(dropped, expected)
        masks.append(dropped == 0)
    # The stream moves: a mask differs from the one before it.
    assert not np.array_equal(masks[0], masks[1])
    assert 0 < np.mean(masks[0]) < 1
    np.testing.assert_array_equal(
        to_numpy(ours.seed_generator.state), to_numpy(keras_s.seed_generator.state)
    )
    # Outside training, nothing is dropped.
    np.testing.assert_array_equal(to_numpy(ours(inputs, training=False)), inputs)


def test_a_restored_stream_position_gives_the_masks_that_followed_it():
    """A checkpoint restores the stream's counters: assigning the position
    saved after one draw gives the second and third masks again."""
    dropout = layers.Dropout(0.3, seed=4)
    inputs = _inputs()
    dropout(inputs, training=True)
    saved = to_numpy(dropout.seed_generator.state).copy()
    following = [to_numpy(dropout(inputs, training=True)) for _ in range(2)]
    dropout.seed_generator.state.assign(saved)
    again = [to_numpy(dropout(inputs, training=True)) for _ in range(2)]
    for first, second in zip(following, again):
        np.testing.assert_array_equal(first, second)


def test_the_model_s_dropouts_are_ours():
    """Every dropout of the model, residual, embedding and attention, draws
    through our layer (and so keeps its stream on the host under torch)."""
    model = kt.build_transformer("tiny", vocabulary_size=40, num_layers=2, attention_dropout=0.1)
    dropouts = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dropout)]
    # 2 embeddings + per encoder block 2 residual and 1 attention, per
    # decoder block 3 residual and 2 attention.
    assert len(dropouts) == 2 + 2 * 3 + 2 * 5
    assert all(type(layer) is layers.Dropout for layer in dropouts)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="only the torch backend moves the seed streams to the host; TensorFlow and JAX keep Keras's placement",
)
def test_under_torch_the_streams_live_on_the_host_whatever_the_default_device():
    import torch

    with keras.device("meta"):
        dropout = layers.Dropout(0.2, seed=3)
    assert dropout.seed_generator.state.value.device.type == "cpu"
    # A seed drawn on the host advances the stream as Keras's draw does.
    keras_s = keras.random.SeedGenerator(3)
    keras_seed = keras.src.backend.torch.random.torch_seed_generator(keras_s).initial_seed()
    assert backend_random.next_seed(dropout.seed_generator) == keras_seed
    np.testing.assert_array_equal(to_numpy(dropout.seed_generator.state), to_numpy(keras_s.state))
    assert dropout.seed_generator.state.value.device == torch.device("cpu")


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="profiles torch's own fused dropout kernel, which only the torch backend calls",
)
def test_under_torch_an_unseeded_dropout_stays_torch_s_fused_one():
    import torch

    dropout = layers.Dropout(0.2)
    with torch.profiler.profile() as profile:
        dropout(torch.ones(4, 8), training=True)
    names = {event.name for event in profile.events()}
    assert "aten::dropout" in names or "aten::native_dropout" in names
    assert "aten::bernoulli" not in names


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="counts the torch operations of the torch backend's host-seeded mask; under TensorFlow and JAX the mask is Keras's own dropout, compiled into the step",
)
def test_under_torch_a_seeded_mask_is_drawn_in_one_pass():
    """The mask is drawn straight into a bool tensor from the keep
    probability's broadcast view: no float32 tensor of the inputs' size
    filled with it, and no cast of the draws (Keras's way, and the same
    mask: the first test)."""
    import torch

    dropout = layers.Dropout(0.3, seed=5)
    inputs = torch.ones(4, 6, 8)
    dropout(inputs, training=True)  # makes the probability's scalar
    with torch_operations() as counted:
        dropped = dropout(inputs, training=True)
    names = [str(operation) for operation in counted.operations]
    aten = torch.ops.aten
    draws = [operation for operation in counted.operations if operation.name().startswith("aten::bernoulli")]
    assert draws == [aten.bernoulli_.Tensor], names
    assert not {aten.full.default, aten._to_copy.default} & set(counted.operations), names
    # The zero of `where` made once, not a scalar tensor a call.
    assert aten.scalar_tensor.default not in counted.operations, names
    assert set(np.unique(to_numpy(dropped))) <= {0.0, np.float32(1 / 0.7)}
    halves = backend_random.dropout(torch.ones(4, 6, 8, dtype=torch.bfloat16), 0.3, None, dropout.seed_generator)
    assert halves.dtype == torch.bfloat16 and float(halves.max()) == float(torch.tensor(1 / 0.7, dtype=torch.bfloat16))
