import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import checks
from keras_transformer.models import PRESETS

from conftest import assert_cached_decoding_matches, in_one_pass, random_ids, to_numpy

V = 40


@pytest.fixture
def model():
    # One block a stack: what these tests check holds for any depth, and a
    # compiled step costs half as much.
    return kt.build_transformer("tiny", vocabulary_size=V, num_layers=1)


@pytest.fixture
def batch(rng):
    source_ids = random_ids(rng, (3, 7), V)
    source_ids[0, 5:] = 0
    source_ids[1, 3:] = 0
    target_ids = random_ids(rng, (3, 6), V)
    target_ids[:, 0] = 1
    return {"source_ids": source_ids, "target_ids": target_ids}


def test_maps_ids_to_float32_next_token_logits(model, batch):
    logits = model(batch)
    assert tuple(logits.shape) == (3, 6, V)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert [i.name for i in model.inputs] == ["source_ids", "target_ids"] or sorted(
        model.input
    ) == ["source_ids", "target_ids"]


def test_changing_later_target_tokens_leaves_earlier_logits(model, batch, rng):
    logits = to_numpy(model(batch))
    for i in range(5):
        changed = dict(batch, target_ids=batch["target_ids"].copy())
        changed["target_ids"][:, i + 1 :] = random_ids(rng, (3, 5 - i), V)
        changed_logits = to_numpy(model(changed))
        np.testing.assert_allclose(changed_logits[:, : i + 1], logits[:, : i + 1], atol=1e-5)


def test_source_padding_does_not_change_any_output(model, batch):
    """More padding after a source, or none, gives the same logits."""
    logits = to_numpy(model(batch))
    padded = dict(
        batch,
        source_ids=np.concatenate([batch["source_ids"], np.zeros((3, 9), "int32")], 1),
    )
    np.testing.assert_allclose(to_numpy(model(padded)), logits, atol=1e-5)
    encoded, mask = model.encode(batch["source_ids"])
    encoded_padded, _ = model.encode(padded["source_ids"])
    real = to_numpy(mask)
    np.testing.assert_allclose(
        to_numpy(encoded_padded)[:, :7][real], to_numpy(encoded)[real], atol=1e-5
    )
    # Row 1 alone, unpadded, decodes the same as inside the padded batch.
    alone = {"source_ids": batch["source_ids"][1:2, :3], "target_ids": batch["target_ids"][1:2]}
    np.testing.assert_allclose(to_numpy(model(alone))[0], logits[1], atol=1e-5)


def test_target_padding_does_not_change_real_positions(model, batch):
    logits = to_numpy(model(batch))
    padded = dict(
        batch,
        target_ids=np.concatenate([batch["target_ids"], np.zeros((3, 4), "int32")], 1),
    )
    np.testing.assert_allclose(to_numpy(model(padded))[:, :6], logits, atol=1e-5)


def test_cached_decoding_equals_full_recomputation(model, batch):
    assert_cached_decoding_matches(model, batch)


def test_dropout_is_applied_to_the_embedding_sums(batch):
    model = kt.build_transformer("tiny", vocabulary_size=V, dropout=0.5, num_layers=1)
    inference = to_numpy(model(batch))
    np.testing.assert_allclose(to_numpy(model(batch, training=False)), inference, atol=1e-6)
    assert np.abs(to_numpy(model(batch, training=True)) - inference).max() > 1e-3


# Torch's pass builds these models in seconds; JAX's draws the 213 million
# initial values in tens of seconds at the suite's XLA settings.
@in_one_pass("torch", "the variables' shapes are our layers'")
@pytest.mark.parametrize("preset, paper_count", [("base", 65e6), ("big", 213e6)])
def test_parameter_count_matches_the_paper(preset, paper_count):
    model = kt.build_transformer(preset, vocabulary_size=37000)
    assert abs(model.count_params() - paper_count) / paper_count < 0.05


def test_presets_are_table_3():
    assert PRESETS["base"] | {} == {
        "vocabulary_size": 37000, "num_layers": 6, "d_model": 512,
        "d_ff": 2048, "num_heads": 8, "dropout": 0.1,
    }
    assert (PRESETS["big"]["d_model"], PRESETS["big"]["d_ff"]) == (1024, 4096)
    assert (PRESETS["big"]["num_heads"], PRESETS["big"]["dropout"]) == (16, 0.3)


def test_overrides_replace_preset_fields():
    model = kt.build_transformer("tiny", vocabulary_size=50, num_layers=1, d_model=32)
    assert (model.vocabulary_size, model.num_layers, model.d_model) == (50, 1, 32)
    assert len(model.encoder_blocks) == len(model.decoder_blocks) == 1


def test_one_shared_embedding_matrix_or_three():
    shared = kt.build_transformer("tiny", vocabulary_size=V)
    separate = kt.build_transformer("tiny", vocabulary_size=V, share_embeddings=False)
    def embedding_matrices(model):
        return [w for w in model.weights if tuple(w.shape) == (V, 64)]
    assert len(embedding_matrices(shared)) == 1
    assert len(embedding_matrices(separate)) == 3
    assert separate.count_params() - shared.count_params() == 2 * V * 64


def test_pre_ln_model_adds_final_norms(batch):
    model = kt.build_transformer("tiny", vocabulary_size=V, normalize_first=True)
    assert model.encoder_norm is not None and model.decoder_norm is not None
    assert tuple(model(batch).shape) == (3, 6, V)


def test_mixed_precision_gives_float32_logits_and_decodes(batch):
    model = kt.build_transformer("tiny", vocabulary_size=V, dtype="mixed_bfloat16")
    assert model.dtype_policy.name == "mixed_bfloat16"
    logits = model(batch)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert np.isfinite(to_numpy(logits)).all()
    encoder_output, mask = model.encode(batch["source_ids"])
    cache = model.initial_cache(encoder_output, max_length=6)
    step_logits, _ = model.decode_step(batch["target_ids"][:, :1], cache, 0, mask)
    np.testing.assert_allclose(to_numpy(step_logits)[:, 0], to_numpy(logits)[:, 0], atol=0.1)


def test_a_decode_step_outside_its_cache_is_refused(batch):
    """Past the cache (or before it) the update wrote the last slot and the
    step returned logits as if it held."""
    model = kt.build_transformer("tiny", vocabulary_size=V)
    encoder_output, mask = model.encode(batch["source_ids"])
    cache = model.initial_cache(encoder_output, max_length=4)
    logits, _ = model.decode_step(batch["target_ids"][:, :2], cache, 2, mask)  # positions 2 and 3: the last
    assert tuple(logits.shape) == (3, 2, V)
    for index, steps in ((3, 2), (4, 1), (-1, 1), (np.int64(7), 1)):
        with pytest.raises(ValueError, match=rf"`index` must be from 0 to {4 - steps} .* cache of 4 positions.*index={index}"):
            model.decode_step(batch["target_ids"][:, :steps], cache, index, mask)


def test_unknown_preset_is_rejected():
    with pytest.raises(ValueError, match=r"Expected one of \['base', 'big', 'small', 'tiny'\]. Received: preset='large'"):
        kt.build_transformer("large")


def test_unknown_override_is_rejected():
    with pytest.raises(ValueError, match=r"Unknown Transformer argument\(s\) \['num_layer'\]"):
        kt.build_transformer("tiny", num_layer=3)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"num_layers": 0}, "num_layers must be an integer >= 1. Received: num_layers=0"),
        ({"d_model": 0}, "d_model must be an integer >= 1. Received: d_model=0"),
        ({"d_ff": -8}, "d_ff must be an integer >= 1. Received: d_ff=-8"),
        ({"num_heads": 2.5}, "num_heads must be an integer >= 1. Received: num_heads=2.5"),
        ({"vocabulary_size": 0}, "vocabulary_size must be an integer >= 1. Received: vocabulary_size=0"),
        ({"dropout": float("nan")}, r"dropout must be a number in \[0, 1\). Received: dropout=nan"),
        ({"dropout": 1.0}, r"dropout must be a number in \[0, 1\). Received: dropout=1.0"),
        ({"attention_dropout": -0.1}, r"attention_dropout must be a number in \[0, 1\). Received: attention_dropout=-0.1"),
        ({"layer_norm_epsilon": 0.0}, "layer_norm_epsilon must be a positive finite number. Received: layer_norm_epsilon=0.0"),
        ({"layer_norm_epsilon": float("inf")}, "layer_norm_epsilon must be a positive finite number. Received: layer_norm_epsilon=inf"),
        ({"seed": -1}, r"seed must be an integer in \[0, 1073741824\]. Received: seed=-1"),
        ({"seed": 2**31}, r"seed must be an integer in \[0, 1073741824\]. Received: seed=2147483648"),
        ({"seed": 1.5}, r"seed must be an integer in \[0, 1073741824\]. Received: seed=1.5"),
    ],
)
def test_sizes_and_rates_outside_their_range_are_rejected(override, message):
    with pytest.raises(ValueError, match=message):
        kt.build_transformer("tiny", **override)


def test_d_model_not_divisible_by_heads_is_rejected():
    with pytest.raises(ValueError, match=r"d_model=64, num_heads=5"):
        kt.build_transformer("tiny", num_heads=5)


@pytest.mark.parametrize("name, bad_id", [("source_ids", V), ("target_ids", -1), ("source_ids", 1000)])
def test_ids_outside_the_vocabulary_are_rejected(model, batch, name, bad_id):
    bad = {k: v.copy() for k, v in batch.items()}
    bad[name][0, 1] = bad_id
    with pytest.raises(ValueError, match=rf"`{name}` holds 1 token id\(s\) outside the vocabulary.*= {bad_id}, expected 0 <= id < vocabulary_size={V}"):
        model(bad)


def test_ids_outside_the_vocabulary_are_rejected_in_compiled_steps(model, batch):
    """`predict` runs a compiled function: tf.function, jax.jit or torch."""
    assert model.predict(batch, verbose=0).shape == (3, 6, V)
    bad = {k: v.copy() for k, v in batch.items()}
    bad["target_ids"][2, 3] = V + 5
    # TensorFlow names the input in an InvalidArgumentError, JAX in a
    # JaxRuntimeError, torch in a ValueError.
    with pytest.raises(Exception, match=r"`target_ids` holds (1 )?token id"):
        model.predict(bad, verbose=0)


def _bad_inputs(batch, case):
    """Inputs Keras would once have turned into other ids, or failed on
    deep inside (TensorFlow's "Biases must be 1D"), or run through."""
    source, target = batch["source_ids"].astype("int64"), batch["target_ids"].astype("int64")
    if case == "float ids":
        source = source.astype("float32")
        source[0, 1] = 5.7
        return {"source_ids": source, "target_ids": target}, r"`source_ids` must hold integer token ids. Received dtype float32"
    if case == "64-bit ids past int32":
        target[2, 3] = 2**32 + 5  # int32 would read 5
        return {"source_ids": source, "target_ids": target}, r"`target_ids` holds 1 token id\(s\) outside the vocabulary: target_ids\[2, 3\] = 4294967301"
    if case == "empty source":
        return {"source_ids": source[:, :0], "target_ids": target}, r"`source_ids` must hold at least one token per row.*Received shape \(3, 0\)"
    if case == "empty target":
        return {"source_ids": source, "target_ids": target[:, :0]}, r"`target_ids` must hold at least one token per row.*Received shape \(3, 0\)"
    return {"source_ids": source[:2], "target_ids": target}, r"must hold the same number of rows.*Received shapes \(2, 7\) and \(3, 6\)"


BAD_INPUTS = ["float ids", "64-bit ids past int32", "empty source", "empty target", "batch sizes differ"]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_inputs_keras_would_convert_or_fail_on_are_clear_errors_everywhere(model, batch, case):
    inputs, message = _bad_inputs(batch, case)
    labels = inputs["target_ids"].astype("int32")
    kt.training.compile_model(model)
    for entry in (
        lambda: model(inputs),
        lambda: model.predict(inputs, verbose=0),
        lambda: model.predict_on_batch(inputs),
        lambda: model.fit(inputs, labels[: len(inputs["source_ids"])], verbose=0),
        lambda: model.train_on_batch(inputs, labels),
        lambda: model.evaluate(inputs, labels[: len(inputs["source_ids"])], verbose=0),
    ):
        with pytest.raises((TypeError, ValueError), match=message):
            entry()


def _compiled_model():
    return kt.training.compile_model(kt.build_transformer("tiny", vocabulary_size=V, num_layers=1))


@pytest.fixture(scope="module")
def reused_model():
    """Under TensorFlow and torch, one compiled model for the tests whose
    data fails inside `fit`: it stays usable after the error, so its steps
    are compiled once, not once a test. None under JAX, where an error
    inside Keras's loop leaves the model's variables unusable."""
    return None if keras.backend.backend() == "jax" else _compiled_model()


@pytest.mark.parametrize("case", ["64-bit ids past int32", "empty target", "batch sizes differ"])
def test_a_dataset_of_bad_inputs_fails_clearly_as_it_runs(reused_model, batch, case):
    """In a dataset, shapes and values are known only as it runs: under
    TensorFlow the graph checks them, under JAX the trace, under torch each
    call; 64-bit ids are checked in the pipeline, before JAX's int32."""
    import tensorflow as tf

    inputs, message = _bad_inputs(batch, case)
    labels = inputs["target_ids"].astype("int32")
    dataset = tf.data.Dataset.from_generator(
        lambda: iter([(inputs, labels)]),
        output_signature=(
            {name: tf.TensorSpec([None, None], tf.int64) for name in inputs},
            tf.TensorSpec([None, None], tf.int32),
        ),
    )
    model = reused_model or _compiled_model()
    # Raised in the graph or the pipeline, the message names no position.
    message = {"64-bit ids past int32": r"`target_ids` holds (1 )?token id"}.get(case, message.split(".*")[0])
    with pytest.raises(Exception, match=message):
        model.fit(dataset, shuffle=False, verbose=0)


def test_float_ids_in_a_dataset_or_a_generator_fail_clearly(model, batch):
    import tensorflow as tf

    kt.training.compile_model(model)
    dataset = tf.data.Dataset.from_tensors(({k: v.astype("float32") for k, v in batch.items()}, batch["target_ids"]))
    with pytest.raises(TypeError, match=r"`source_ids` must hold integer token ids. Received a dataset of dtype float32"):
        model.fit(dataset, shuffle=False, verbose=0)
    # A Python generator reaches the model only inside the compiled step
    # (JAX's trainer calls `call` itself, past `__call__`).
    floats = ({k: v.astype("float32") for k, v in batch.items()}, batch["target_ids"])
    with pytest.raises(TypeError, match=r"`source_ids` must hold integer token ids. Received dtype float32"):
        model.fit((floats for _ in range(2)), steps_per_epoch=1, verbose=0)


class _Batches(keras.utils.PyDataset):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        return self.batches[index]


def _as(form, inputs, labels=None):
    """`fit`/`evaluate`/`predict` arguments for one batch, in one of Keras's
    forms of data."""
    import tensorflow as tf

    element = inputs if labels is None else (inputs, labels)
    if form == "arrays":
        return element if labels is not None else (inputs,)
    if form == "dataset":
        return (tf.data.Dataset.from_tensors(element),)
    if labels is None:
        element = (inputs,)  # what generators and PyDatasets give `predict`
    if form == "generator":
        return ((element for _ in range(1)),)
    return (_Batches([element]),)


FORMS = ["arrays", "dataset", "generator", "py_dataset"]


@pytest.mark.parametrize("form", FORMS)
def test_bad_ids_fail_clearly_in_every_form_of_data(reused_model, batch, form):
    """However the data comes, an id outside the vocabulary is an error that
    names the input; under JAX it is found on the host where it can be."""
    labels = batch["target_ids"]
    bad = {k: v.copy() for k, v in batch.items()}
    bad["target_ids"][2, 3] = V + 5
    message = r"`target_ids` holds (1 )?token id"
    runs = [
        lambda model, data: model.fit(*_as(form, data, labels), verbose=0, **({} if form == "arrays" else {"steps_per_epoch": 1})),
        lambda model, data: model.evaluate(*_as(form, data, labels), verbose=0),
        lambda model, data: model.predict(*_as(form, data), verbose=0),
    ]
    if keras.backend.backend() != "jax":
        # One check serves all three there, the model's own in the step.
        runs = runs[:1]
    for run in runs:
        # A fresh model for each under JAX (`reused_model`).
        model = reused_model or _compiled_model()
        run(model, batch)  # good data first: the compiled function is made (or was), then reused
        with pytest.raises(Exception, match=message):
            run(model, bad)


def test_under_jax_compiled_steps_leave_the_id_check_to_the_host(model, batch, monkeypatch):
    """A check inside `jax.jit` is a device-to-host callback in every step.
    Data checked on the host is stepped without it; data that cannot be (a
    `PyDataset`) is stepped with it, in functions traced anew for it."""
    if keras.backend.backend() != "jax":
        pytest.skip("the host callback is JAX's")
    import jax

    callbacks = []
    real_callback = jax.debug.callback
    def counting_callback(*args, **kwargs):
        if not checks._inferring_shapes():  # shapes Keras infers run nothing
            callbacks.append(1)
        return real_callback(*args, **kwargs)

    monkeypatch.setattr(jax.debug, "callback", counting_callback)
    kt.training.compile_model(model)
    labels = batch["target_ids"]
    for form in ("arrays", "dataset", "generator"):
        model.fit(*_as(form, batch, labels), verbose=0, **({} if form == "arrays" else {"steps_per_epoch": 1}))
        model.evaluate(*_as(form, batch, labels), verbose=0)
        model.predict(*_as(form, batch), verbose=0)
    # The batch methods too, on a model whose steps are not made yet (a
    # second, later definition of these two once replaced the checking ones).
    fresh = kt.training.compile_model(kt.build_transformer("tiny", vocabulary_size=V, num_layers=1))
    fresh.test_on_batch(batch, labels)
    fresh.predict_on_batch(batch)
    assert callbacks == []
    bad = {k: v.copy() for k, v in batch.items()}
    bad["source_ids"][1, 2] = -1
    with pytest.raises(ValueError, match=r"`source_ids` holds 1 token id\(s\) outside the vocabulary: source_ids\[1, 2\] = -1"):
        model.fit(bad, labels, verbose=0)
    # Found before the step, so the model's variables are intact.
    history = model.fit(batch, labels, epochs=2, verbose=0).history["loss"]
    assert np.isfinite(history).all()
    model.predict(*_as("py_dataset", batch), verbose=0)
    assert len(callbacks) == 2  # source and target ids, traced once
    with pytest.raises(Exception, match=r"`target_ids` holds 18 token id\(s\) outside the vocabulary"):
        model.predict(*_as("py_dataset", {**batch, "target_ids": np.full_like(labels, V)}), verbose=0)
