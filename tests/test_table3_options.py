"""The model variations of Table 3 and section 4: head sizes d_k and d_v,
learned positions, restricted self-attention."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import layers
from keras_transformer.decoding.steps import search_translations

from conftest import assert_cached_decoding_matches, in_one_pass, random_ids, to_numpy

V = 40
D = 64  # the tiny preset's d_model, 4 heads of 16 by default

# Every option away from its default at once.
ALL_OPTIONS = {
    "key_dim": 8,
    "value_dim": 24,
    "position_encoding": "learned",
    "max_length": 12,
    "attention_window": 2,
}


@pytest.fixture
def batch(rng):
    source_ids = random_ids(rng, (3, 9), V)
    source_ids[0, 6:] = 0
    target_ids = random_ids(rng, (3, 8), V)
    target_ids[:, 0] = 1
    return {"source_ids": source_ids, "target_ids": target_ids}


def tiny(seed=5, **options):
    return kt.build_transformer("tiny", vocabulary_size=V, seed=seed, **options)


def with_weights_of(model, options):
    """A model with `options` and the weights of `model`, which must have
    the same weight shapes."""
    other = tiny(**options)
    other.set_weights(model.get_weights())
    return other


@pytest.mark.parametrize(
    "options",
    [
        {"key_dim": 16, "value_dim": 16},  # d_k = d_v = d_model / h, the default
        {"attention_window": 15},  # every key of a length-9 source is in reach
    ],
    ids=["head_sizes", "window"],
)
def test_options_at_their_default_value_give_the_default_model(options, batch):
    model = tiny()
    explicit = with_weights_of(model, options)
    np.testing.assert_allclose(to_numpy(explicit(batch)), to_numpy(model(batch)), atol=1e-5)


def test_head_sizes_shape_the_projections_and_the_parameter_count(batch):
    default, model = tiny(), tiny(key_dim=8, value_dim=24)
    block = model.get_layer("encoder_block_0").self_attention
    assert tuple(block.query_dense.kernel.shape) == (D, 4, 8)
    assert tuple(block.key_dense.kernel.shape) == (D, 4, 8)
    assert tuple(block.value_dense.kernel.shape) == (D, 4, 24)
    assert tuple(block.output_dense.kernel.shape) == (4, 24, D)
    # Per attention layer, W^Q and W^K shrink from 16 to 8 per head, W^V and
    # W^O grow from 16 to 24 (with their biases); 2 + 2 * 2 = 6 attention
    # layers in the two-block tiny model.
    per_layer = (2 * (D * 4 * 8 + 4 * 8) + D * 4 * 24 + 4 * 24 + 4 * 24 * D) - (
        3 * (D * 4 * 16 + 4 * 16) + 4 * 16 * D
    )
    assert model.count_params() - default.count_params() == 6 * per_layer
    assert tuple(model(batch).shape) == (3, 8, V)


def test_learned_positions_are_one_table_per_side(batch):
    model = tiny(position_encoding="learned", max_length=12)
    tables = [w for w in model.weights if "position_embeddings" in w.path]
    assert sorted(tuple(w.shape) for w in tables) == [(12, D), (12, D)]
    assert model.count_params() - tiny().count_params() == 2 * 12 * D
    # The positions matter: the same model with the tables swapped gives
    # other logits.
    logits = to_numpy(model(batch))
    source_table, target_table = (
        model.get_layer(f"{side}_position_embedding").position_embeddings
        for side in ("source", "target")
    )
    swapped = to_numpy(source_table)
    source_table.assign(to_numpy(target_table))
    target_table.assign(swapped)
    assert np.abs(to_numpy(model(batch)) - logits).max() > 1e-3


@pytest.mark.parametrize("side", ["source_ids", "target_ids"])
def test_learned_positions_fail_clearly_past_max_length(batch, side):
    model = tiny(position_encoding="learned", max_length=9)
    too_long = dict(batch)
    too_long[side] = np.pad(batch[side], ((0, 0), (0, 10 - batch[side].shape[1])))
    message = r"cover 9 positions \(max_length=9\)"
    with pytest.raises(ValueError, match=message):
        model(too_long)
    # And inside compiled steps, where the length is known only when run
    # under TensorFlow: a graph assertion there.
    with pytest.raises(Exception, match=message):
        model.predict(too_long, verbose=0)


def test_decoding_past_learned_positions_fails_clearly(batch):
    model = tiny(position_encoding="learned", max_length=8)
    encoder_output, mask = model.encode(batch["source_ids"][:, :8])
    with pytest.raises(ValueError, match=r"max_length=8, so it cannot decode max_length=9"):
        model.initial_cache(encoder_output, 9)
    cache = model.initial_cache(encoder_output, 8)
    with pytest.raises(ValueError, match=r"1 positions starting at 8|must be from 0 to 7 for 1 target position.*Received: index=8"):
        model.decode_step(batch["target_ids"][:, :1], cache, 8, mask)


def test_translations_stop_at_the_last_learned_position(batch):
    model = tiny(position_encoding="learned", max_length=12)
    source_ids = batch["source_ids"]
    ids, scores = search_translations(
        model, source_ids, np.full((3,), 9 + 50, "int32"), beam_size=2, alpha=0.6,
        max_extra_length=50, bos_id=1, eos_id=2,
    )  # fmt: skip
    assert tuple(ids.shape) == (3, 2, 12)
    assert np.isfinite(to_numpy(scores)).all()


def test_restricted_attention_ignores_keys_outside_the_window(rng):
    """Perturbing the input at distance > r leaves output t; at distance r,
    it moves it. Causal in the decoder: only earlier positions count."""
    r = 2
    encoder = layers.TransformerEncoderBlock(4, 32, dropout=0.0, attention_window=r)
    decoder = layers.TransformerDecoderBlock(4, 32, dropout=0.0, attention_window=r)
    x = rng.normal(size=(1, 10, 16)).astype("float32")
    memory = rng.normal(size=(1, 4, 16)).astype("float32")
    t = 5
    for name, call, first, last in (
        ("encoder", lambda x: encoder(x), t - r, t + r),
        ("decoder", lambda x: decoder(x, memory), t - r, t),
    ):
        outputs = to_numpy(call(x))
        for s in range(10):
            moved = x.copy()
            moved[0, s] += 1.0
            change = np.abs(to_numpy(call(moved))[0, t] - outputs[0, t]).max()
            if first <= s <= last:
                assert change > 1e-4, (name, s)
            else:
                assert change < 1e-5, (name, s)


@pytest.mark.parametrize(
    "options",
    [
        {"key_dim": 8, "value_dim": 24},
        {"position_encoding": "learned", "max_length": 12},
        {"attention_window": 1},
        ALL_OPTIONS,
    ],
    ids=["head_sizes", "learned_positions", "window", "all"],
)
def test_cached_decoding_equals_full_recomputation(options, batch):
    assert_cached_decoding_matches(tiny(**options), batch)


def test_options_survive_keras_save_and_load(batch, tmp_path):
    model = tiny(**ALL_OPTIONS)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.get_config() == model.get_config()
    assert {k: loaded.get_config()[k] for k in ALL_OPTIONS} == ALL_OPTIONS
    np.testing.assert_allclose(to_numpy(loaded(batch)), to_numpy(model(batch)), atol=1e-6)


@in_one_pass("torch", "a file of every option saved here and loaded under another backend; test_serialization.py does so from every pass")
def test_options_load_under_another_backend(batch, tmp_path):
    from test_serialization import logits_under_another_backend

    model = tiny(**ALL_OPTIONS)
    np.testing.assert_allclose(logits_under_another_backend(model, batch, tmp_path), to_numpy(model(batch)), atol=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"key_dim": 0}, "key_dim must be an integer >= 1 or None. Received: key_dim=0"),
        ({"value_dim": 2.5}, "value_dim must be an integer >= 1 or None. Received: value_dim=2.5"),
        ({"attention_window": -1}, "attention_window must be an integer >= 0 or None. Received: attention_window=-1"),
        ({"position_encoding": "rotary"}, "position_encoding must be one of \\['sinusoidal', 'learned', 'table'\\]. Received: position_encoding='rotary'"),
        ({"position_encoding": "learned"}, "needs max_length.*Received: max_length=None"),
        ({"max_length": 64}, "sinusoids have no maximum.*Received: position_encoding='sinusoidal', max_length=64"),
        ({"max_length": 0, "position_encoding": "learned"}, "max_length must be an integer >= 1 or None. Received: max_length=0"),
    ],
)  # fmt: skip
def test_options_outside_their_range_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        tiny(**options)


def test_a_head_size_frees_d_model_from_dividing_by_the_heads(batch):
    with pytest.raises(ValueError, match="or key_dim must be given"):
        tiny(num_heads=3)
    model = tiny(num_heads=3, key_dim=20)
    assert tuple(model(batch).shape) == (3, 8, V)


@in_one_pass("torch", "parameter counts, from our layers' variable shapes; four base models take JAX tens of seconds")
def test_the_guide_example_prints_what_it_shows(capsys):
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[1] / "docs" / "guide.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "attention_window=10" in b)
    shown = [line[2:] for line in block.splitlines() if line.startswith("# ")]
    exec(block, {})
    assert capsys.readouterr().out.splitlines() == shown
