"""The model's step functions and the search of a batch (keras_transformer/decoding/steps.py)."""

import importlib

import keras
import numpy as np
import pytest
from conftest import in_passes, to_numpy
from translation_fixtures import SENTENCES
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)
from translation_fixtures import source_batch

import keras_transformer as kt
from keras_transformer.decoding import cached_step_function
from keras_transformer.decoding import search_translations
from keras_transformer.decoding.compiled import CompiledFunction


@pytest.mark.parametrize("beam_size", [1, 3])
def test_caches_that_grow_in_phases_decode_as_whole_ones(model, tokenizer, monkeypatch, beam_size):
    """`search_translations` grows the self-attention caches in phases of
    16, 32 and 40 positions; an EOS that never comes makes every output run
    through all three. Caches of 40 positions from the start must give the
    same outputs and scores."""
    source_ids = source_batch(tokenizer, SENTENCES[:2])
    max_extra_length = 40 - source_ids.shape[1]
    assert kt.decoding.cache_lengths(40) == (16, 32, 40)
    grown = []
    grow = kt.decoding.grow_cache
    monkeypatch.setattr(
        "keras_transformer.decoding.steps.grow_cache",
        lambda cache, length: grown.append(length) or grow(cache, length),
    )

    def search():
        ids, scores = search_translations(
            model, source_ids, np.full((2,), 40, "int32"), beam_size=beam_size, alpha=0.6,
            max_extra_length=max_extra_length, bos_id=tokenizer.bos_id, eos_id=-1,
        )  # fmt: skip
        return to_numpy(ids), to_numpy(scores)

    growing = search()
    assert grown == [32, 40]
    assert (growing[0][:, :, -1] > 0).all()  # every output is 40 tokens long
    monkeypatch.setattr("keras_transformer.decoding.steps.cache_lengths", lambda max_length: None)
    whole = search()
    np.testing.assert_array_equal(growing[0], whole[0])
    np.testing.assert_allclose(growing[1], whole[1], rtol=1e-5)


def test_cached_step_function_gives_the_full_model_logits(model, tokenizer):
    source_ids = source_batch(tokenizer, SENTENCES[:2])
    target_ids = np.array([[tokenizer.bos_id, 17, 25, 40, 9], [tokenizer.bos_id, 8, 8, 60, 3]], "int32")
    full = to_numpy(model({"source_ids": source_ids, "target_ids": target_ids}))
    step_fn, state = cached_step_function(model, source_ids, max_length=5)
    for index in range(5):
        logits, state = step_fn(target_ids, index, state)
        np.testing.assert_allclose(to_numpy(logits), full[:, index], atol=1e-5)


@pytest.mark.parametrize(
    "ending",
    [
        # XLA's pairing is the same code under JAX and TensorFlow: CI runs
        # both endings under JAX, and the one past the caches' first phase
        # under TensorFlow too.
        pytest.param("eos", marks=in_passes(("jax", "torch"), "XLA's pairing of steps, the same program under JAX")),
        "limits",
    ],
)
def test_a_compiled_search_pairs_its_steps_under_xla_for_a_large_cache(model, tokenizer, monkeypatch, ending):
    """Under XLA (JAX, TensorFlow with `jit_compile`) a beam search whose
    cache reaches `PAIRED_STEPS_CACHE_BYTES` runs two steps an iteration;
    its beams and scores must be those of one step an iteration. The
    outputs end at different steps, at EOS, or at their own limits, past
    the first phase of the growing caches (no token is EOS)."""
    steps_module = importlib.import_module("keras_transformer.decoding.steps")
    # The sentences of under 20 pieces: caches of two phases (16, 26), not three, make smaller programs.
    pieces = tokenizer.tokenize(SENTENCES)
    sentences = [s for s, ids in zip(SENTENCES, pieces, strict=True) if s.strip() and len(ids) < 20]
    source_ids = source_batch(tokenizer, sentences)
    limits = (np.arange(len(source_ids), dtype="int32") % 4) + source_ids.shape[1] + 2
    assert kt.decoding.cache_lengths(source_ids.shape[1] + 6) is not None  # the premise
    decide, decisions = steps_module.search_steps_per_iteration, []

    def deciding(*args, **kwargs):
        decisions.append(decide(*args, **kwargs))
        return decisions[-1]

    def search(source, limit, decoding):
        with monkeypatch.context() as patch:
            patch.setattr(steps_module, "search_steps_per_iteration", deciding)
            return search_translations(
                model, source, limit, beam_size=3, alpha=0.6, max_extra_length=6,
                bos_id=tokenizer.bos_id, eos_id=eos_id, decoding=decoding,
            )  # fmt: skip

    eos_id = tokenizer.eos_id if ending == "eos" else -1
    backend = keras.backend.backend()
    results = []
    for threshold in (2**62, 0):
        monkeypatch.setattr(steps_module, "PAIRED_STEPS_CACHE_BYTES", threshold)
        compiled = CompiledFunction(search, model, [2, 1], jit_compile=backend == "tensorflow")
        results.append(compiled(source_ids, limits))
    assert decisions == [1, 1 if backend == "torch" else 2]
    lengths = [np.count_nonzero(row) for row in results[0][0][:, 0]]
    assert len(set(lengths)) > 1, lengths  # the premises
    if ending == "limits":
        assert max(lengths) > steps_module.FIRST_CACHE_LENGTH, lengths
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_allclose(results[1][1], results[0][1], atol=1e-5)


@pytest.mark.parametrize("ending", ["eos", "limits"])
def test_a_compiled_search_sheds_the_done_half_of_its_batch_and_finds_the_same(model, tokenizer, monkeypatch, ending):
    """A compiled beam search of 8 sentences in order of length (as
    `Translator` sorts them) runs on without the first 4 once they are
    done (`SHED_FROM`), over the step function `narrow_step` gives for the
    rest. Its beams and scores must be those of the whole batch run to the
    end, with outputs that end at EOS, or at their own limits past the
    caches' first phase. (TensorFlow's traced search without XLA has no
    static batch size, and does not shed.)"""
    search_module = importlib.import_module("keras_transformer.decoding.beam_search")
    sentences = sorted((s for s in SENTENCES if s.strip()), key=len)
    sentences = sentences + sentences[-1:] * (8 - len(sentences))
    source_ids = source_batch(tokenizer, sentences)
    limits = np.arange(8, dtype="int32") + source_ids.shape[1] + (2 if ending == "eos" else 16)
    narrowed, narrow = [], search_module._sentences

    def search(source, limit, decoding):
        return search_translations(
            model, source, limit, beam_size=3, alpha=0.6, max_extra_length=24, bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id if ending == "eos" else -1, decoding=decoding,
        )

    results = []
    for shed_from in (2**31, 8):
        with monkeypatch.context() as patch:
            patch.setattr(search_module, "SHED_FROM", shed_from)
            patch.setattr(search_module, "_sentences", lambda *args: narrowed.append(args[1:3]) or narrow(*args))
            compiled = CompiledFunction(search, model, [2, 1], jit_compile=keras.backend.backend() == "tensorflow")
            results.append(compiled(source_ids, limits))
    assert narrowed == [(4, None), (0, 4)]  # traced once: 8 sentences shed 4, and 4 do not
    lengths = [np.count_nonzero(row) for row in results[0][0][:, 0]]
    assert len(set(lengths)) > 1, lengths  # the premises
    if ending == "limits":
        assert lengths == list(limits) and min(lengths) > kt.decoding.steps.FIRST_CACHE_LENGTH, lengths
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_allclose(results[1][1], results[0][1], atol=1e-5)
