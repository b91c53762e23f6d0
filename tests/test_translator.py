"""Translator, the model's cached step function, the CLI and attention plots."""

import collections
import importlib
import itertools
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
from conftest import to_numpy

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer import torch_products
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import builtin_corpus
from keras_transformer.decoding import Translator
from keras_transformer.decoding import beam_search
from keras_transformer.decoding import cached_step_function
from keras_transformer.decoding import cross_attention_map
from keras_transformer.decoding import greedy_search
from keras_transformer.decoding import plot_cross_attention
from keras_transformer.decoding import search_translations
from keras_transformer.decoding.compiled import CompiledFunction
from keras_transformer.decoding.compiled import _direct_layer_calls
from keras_transformer.decoding.compiled import _TracedLoops
from keras_transformer.decoding.compiled import _remembered
from keras_transformer.torch_products import ONEDNN_MIN_PRODUCT
from keras_transformer.torch_products import matrix_product_form

SENTENCES = [
    "the old man sees the dog .",
    "a woman helps the small child .",
    "",
    "because the dog sleeps , the man reads a book .",
    "the cat .",
    "   ",
    "today the young woman visits the old man in the big house .",
    "the man sees a dog and the woman sees a cat .",
]


@pytest.fixture(scope="module")
def tokenizer():
    return SubwordTokenizer.train(builtin_corpus("train", size=300, seed=0), 400)


@pytest.fixture(scope="module")
def model(tokenizer):
    """An untrained tiny model that ends its outputs after different numbers
    of steps: EOS gets the (shared) embedding of a token the model emits
    often, plus noise, so that the two compete. Random weights differ by
    backend, so seeds are tried until the outputs vary as the tests need."""
    for seed in range(7, 40):
        keras.utils.set_random_seed(seed)
        model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size)
        translator = Translator(model, tokenizer, beam_size=3, batch_size=4, max_extra_length=6)
        emitted = np.concatenate([ids[0] for _, ids, _ in translator.search(SENTENCES).values()])
        embedding = model.source_embedding.embeddings
        weights = to_numpy(embedding)
        noise = np.random.default_rng(0).normal(size=weights.shape[1]) / np.sqrt(weights.shape[1])
        favourites = np.argsort(-np.bincount(emitted[emitted > 0]))[:3]
        for favourite, scale in itertools.product(favourites, (0.3, 0.1, 0.6, 1.0)):
            weights[tokenizer.eos_id] = weights[favourite] + scale * noise
            embedding.assign(weights)
            if varied(translator):
                return model
    raise AssertionError("No seed from 7 to 39 gave a model whose outputs vary")


def varied(translator):
    """The premise of the tests that use the model: outputs end at different
    steps, five or more of them differ, and none holds a line break (byte
    pieces can spell one), which files of one translation per line cannot."""
    texts = SENTENCES + ["the dog sees the old man and the cat ."]
    translations = translator.translate(texts)
    one_line = all(len(t.splitlines()) <= 1 and "\r" not in t for t in translations)
    return len(end_positions(translator)) > 2 and len(set(translations)) > 4 and one_line


def end_positions(translator):
    """Where the best hypothesis of each sentence ends."""
    eos_id = translator.tokenizer.eos_id
    return {
        list(ids[0]).index(eos_id) if eos_id in ids[0] else None
        for _, ids, _ in translator.search(SENTENCES).values()
    }


def source_batch(tokenizer, sentences):
    rows = [ids + [tokenizer.eos_id] for ids in tokenizer.tokenize(sentences)]
    source_ids = np.zeros((len(rows), max(map(len, rows))), "int32")
    for i, ids in enumerate(rows):
        source_ids[i, : len(ids)] = ids
    return source_ids


def test_a_batch_translates_as_its_sentences_one_by_one(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=3, batch_size=4, max_extra_length=6)
    together = translator.n_best(SENTENCES)
    assert len(end_positions(translator)) > 2  # the premise: outputs end at different steps
    # Alone: an empty one, the shortest and the two longest (each alone is
    # one more shape to compile under XLA).
    for sentence, hypotheses in [(SENTENCES[i], together[i]) for i in (2, 4, 6, 7)]:
        alone = translator.n_best([sentence])[0]
        assert [t for t, _ in alone] == [t for t, _ in hypotheses]
        np.testing.assert_allclose([s for _, s in alone], [s for _, s in hypotheses], atol=1e-4)


def test_beam_size_one_without_length_penalty_is_greedy_on_the_model(model, tokenizer):
    source_ids = source_batch(tokenizer, [s for s in SENTENCES if s.strip()])
    bos = keras.ops.full((len(source_ids),), tokenizer.bos_id, dtype="int32")
    results = []
    for search, arguments in ((greedy_search, {}), (beam_search, {"beam_size": 1, "alpha": 0.0})):
        step_fn, state = cached_step_function(model, source_ids, max_length=12)
        ids, scores = search(step_fn, bos, state, max_length=12, eos_id=tokenizer.eos_id, **arguments)
        results.append((to_numpy(ids).reshape(len(source_ids), -1), to_numpy(scores).reshape(-1)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-5)


def test_greedy_translator_equals_argmax_over_full_recomputation(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=1, max_extra_length=6)
    found = translator.search(SENTENCES)
    source_ids = source_batch(tokenizer, [SENTENCES[i] for i in found])
    limits = [len(source) - 1 + 6 for source, _, _ in found.values()]
    # Recompute the whole model on every prefix, without a cache. The
    # prefixes sit in a zero-padded buffer of one shape (target padding does
    # not change earlier positions), so compiled backends compile once.
    targets = np.zeros((len(found), max(limits) + 1), "int32")
    targets[:, 0] = tokenizer.bos_id
    done = np.zeros(len(found), bool)
    for step in range(max(limits)):
        logits = to_numpy(model({"source_ids": source_ids, "target_ids": targets}))
        tokens = np.argmax(logits[:, step], axis=-1)
        writing = ~done & (step < np.array(limits))
        targets[writing, step + 1] = tokens[writing]
        done |= writing & (tokens == tokenizer.eos_id)
    for row, (_, ids, _) in enumerate(found.values()):
        np.testing.assert_array_equal(ids[0, : max(limits)], targets[row, 1:])


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
        "keras_transformer.decoding.translator.grow_cache",
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
    monkeypatch.setattr("keras_transformer.decoding.translator.cache_lengths", lambda max_length: None)
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


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_the_compiled_search_equals_the_search_through_keras_layer_calls(model, tokenizer, quantize):
    """The `Translator`'s search is compiled under TensorFlow and JAX, and
    under torch calls each built layer's `call` (or int8 `quantized_call`)
    directly and replays traces of its loops (decoding/compiled.py). Its
    beams and scores must be those of the same search run eagerly through
    `Layer.__call__`, for a second batch of the same shape too (with other
    sentences and limits, which a trace must take from that call); the
    model has dropout, which neither may apply."""
    assert model.dropout > 0
    translator = Translator(model, tokenizer, beam_size=3, max_extra_length=6, quantize=quantize)
    sentences = [s for s in SENTENCES if s.strip()]
    first = source_batch(tokenizer, sentences)
    second = source_batch(tokenizer, sentences[::-1])
    width = max(first.shape[1], second.shape[1])
    for number, source_ids in enumerate((first, second)):
        source_ids = np.pad(source_ids, ((0, 0), (0, width - source_ids.shape[1])))
        limits = (np.arange(len(source_ids), dtype="int32") + number) % 4 + width
        compiled_ids, compiled_scores = translator._search(source_ids, limits)
        ids, scores = translator._search_batch(
            keras.ops.convert_to_tensor(source_ids), keras.ops.convert_to_tensor(limits)
        )
        np.testing.assert_array_equal(compiled_ids, to_numpy(ids))
        # int8 layers quantize their inputs at every call, so a rounding
        # difference between XLA's fused arithmetic and the eager one can
        # move an activation by one int8 step: a score then differs by about
        # 1e-4 of its size (seen under JAX, once the attention over the cache
        # was written out: -23.3806 against -23.3763), and by about 1.5e-3
        # where the step is in the output projection's input (torch:
        # -27.8563 against -27.8158), whose int8 product moves every logit.
        tolerance = {"atol": 1e-4} if quantize is None else {"rtol": 5e-3}
        np.testing.assert_allclose(compiled_scores, to_numpy(scores), **tolerance)
    if translator._search.loops is not None:
        # The condition and the body, once for each phase of the growing
        # caches (`cache_lengths`), whose shapes differ.
        phases = len(kt.decoding.cache_lengths(width + 6) or [width + 6])
        assert phases > 1  # the premise: the caches grow
        assert translator._search.loops.count == 2 * phases


@pytest.mark.parametrize("ending", ["eos", "limits"])
def test_a_compiled_search_pairs_its_steps_under_xla_for_a_large_cache(model, tokenizer, monkeypatch, ending):
    """Under XLA (JAX, TensorFlow with `jit_compile`) a beam search whose
    cache reaches `PAIRED_STEPS_CACHE_BYTES` runs two steps an iteration;
    its beams and scores must be those of one step an iteration. The
    outputs end at different steps, at EOS, or at their own limits, past
    the first phase of the growing caches (no token is EOS)."""
    translator_module = importlib.import_module("keras_transformer.decoding.translator")
    sentences = [s for s in SENTENCES if s.strip()]
    source_ids = source_batch(tokenizer, sentences)
    limits = (np.arange(len(source_ids), dtype="int32") % 4) + source_ids.shape[1] + 2
    assert kt.decoding.cache_lengths(source_ids.shape[1] + 6) is not None  # the premise
    decide, decisions = translator_module.search_steps_per_iteration, []

    def deciding(*args):
        decisions.append(decide(*args))
        return decisions[-1]

    def search(source, limit):
        with monkeypatch.context() as patch:
            patch.setattr(translator_module, "search_steps_per_iteration", deciding)
            return search_translations(
                model, source, limit, beam_size=3, alpha=0.6, max_extra_length=6,
                bos_id=tokenizer.bos_id, eos_id=eos_id,
            )  # fmt: skip

    eos_id = tokenizer.eos_id if ending == "eos" else -1
    backend = keras.backend.backend()
    results = []
    for threshold in (2**62, 0):
        monkeypatch.setattr(translator_module, "PAIRED_STEPS_CACHE_BYTES", threshold)
        compiled = CompiledFunction(search, model, [2, 1], jit_compile=backend == "tensorflow")
        results.append(compiled(source_ids, limits))
    assert decisions == [1, 1 if backend == "torch" else 2]
    lengths = [np.count_nonzero(row) for row in results[0][0][:, 0]]
    assert len(set(lengths)) > 1, lengths  # the premises
    if ending == "limits":
        assert max(lengths) > translator_module.FIRST_CACHE_LENGTH, lengths
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_allclose(results[1][1], results[0][1], atol=1e-5)


def test_a_mixed_precision_model_decodes_through_keras_layer_calls():
    """Under mixed precision the layers need `Layer.__call__`'s dtype scope,
    so `CompiledFunction` must not call them directly (under torch, doing so
    fails on a bfloat16 input to a float32 kernel)."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = kt.build_transformer("tiny", vocabulary_size=300)
    finally:
        keras.config.set_dtype_policy("float32")
    source_ids = np.random.default_rng(0).integers(4, 300, (3, 7)).astype("int32")
    source_ids[:, -1] = 2
    limits = np.full((3,), 10, "int32")

    def search(source_ids, limits):
        return search_translations(model, source_ids, limits, beam_size=2, alpha=0.6, max_extra_length=4, bos_id=1, eos_id=2)

    compiled_ids, compiled_scores = CompiledFunction(search, model, [2, 1])(source_ids, limits)
    ids, scores = search(keras.ops.convert_to_tensor(source_ids), keras.ops.convert_to_tensor(limits))
    np.testing.assert_array_equal(compiled_ids, to_numpy(ids))
    np.testing.assert_allclose(compiled_scores, to_numpy(scores), rtol=5e-3)  # bfloat16: XLA fuses differently


def test_direct_layer_calls_skip_keras_call_for_built_layers_only_and_end_with_their_block():
    class Seen(keras.layers.Layer):
        def build(self, shape):
            self.built = True

        def call(self, x):
            self.seen = x
            return x

    built, unbuilt = Seen(), Seen()
    built.build((2,))
    x = np.ones((1, 2), "float32")
    with pytest.raises(RuntimeError, match="inside"):
        with _direct_layer_calls():
            built(x)
            assert built.seen is x  # `call` itself: Keras would convert x to a tensor
            unbuilt(x)
            assert unbuilt.built and unbuilt.seen is not x  # built by Keras's own `__call__`
            with _direct_layer_calls(active=False):
                built(x)
                assert built.seen is not x
            built(x)
            assert built.seen is x
            raise RuntimeError("an error inside the block")
    built(x)
    assert built.seen is not x


def test_operations_still_see_keras_tensors_in_nests_while_layers_are_called_directly():
    """While decoding directly, an operation's test for Keras tensors looks
    through lists, tuples and dicts only (decoding/compiled.py); it must
    still send a symbolic call, nested or not, down Keras's symbolic path."""
    symbolic = keras.KerasTensor((2, 3))
    with _direct_layer_calls():
        joined = keras.ops.concatenate([symbolic, (symbolic,)[0]], axis=0)
        stacked = keras.ops.stack((symbolic, symbolic))
        shifted = keras.ops.add(symbolic, 1.0)
        real = keras.ops.add(np.ones((2, 3), "float32"), 1.0)
    assert isinstance(joined, keras.KerasTensor) and tuple(joined.shape) == (4, 3)
    assert isinstance(stacked, keras.KerasTensor) and tuple(stacked.shape) == (2, 2, 3)
    assert isinstance(shifted, keras.KerasTensor)
    np.testing.assert_array_equal(to_numpy(real), np.full((2, 3), 2.0))


def test_cache_writes_while_decoding_directly_equal_keras_slice_update_and_leave_the_input():
    """Under torch, while decoding directly, `slice_update` copies its input
    and writes the update as a block (decoding/compiled.py); on every
    backend its result must be Keras's, at int and tensor starts, and its
    input must be unchanged."""
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(2, 6, 3, 4)).astype("float32")
    two, one = (keras.ops.convert_to_tensor(i, "int32") for i in (2, 1))
    cases = [
        ([0, two, 0, 0], rng.normal(size=(2, 1, 3, 4)).astype("float32")),
        ([1, 2, 0, one], rng.normal(size=(1, 2, 3, 2)).astype("float32")),
    ]
    for starts, updates in cases:
        expected = to_numpy(keras.ops.slice_update(inputs, starts, updates))
        given = keras.ops.convert_to_tensor(inputs)
        with _direct_layer_calls():
            written = keras.ops.slice_update(given, starts, keras.ops.convert_to_tensor(updates))
        np.testing.assert_array_equal(to_numpy(written), expected)
        np.testing.assert_array_equal(to_numpy(given), inputs)
        assert not np.array_equal(expected, inputs)


def test_attention_while_decoding_directly_equals_keras_dot_product_attention():
    """Under torch, while decoding directly, `dot_product_attention` gives
    torch the transposed views of its inputs instead of contiguous copies
    (decoding/compiled.py); on every backend its result must be Keras's,
    with and without a mask, for a query that may attend to no key, for
    keys and values that are views of a larger cache, and for the cases it
    leaves to Keras (a bias)."""
    rng = np.random.default_rng(0)
    query = rng.normal(size=(2, 3, 2, 4)).astype("float32")  # [B, T, N, H]
    cache = rng.normal(size=(2, 2, 5, 4)).astype("float32")  # [B, N, S, H]
    mask = rng.random((2, 1, 3, 5)) < 0.6
    mask[0, 0, 1] = False  # attends to no key
    bias = rng.normal(size=(2, 1, 3, 5)).astype("float32")
    cases = [{}, {"mask": mask}, {"bias": bias}, {"mask": mask, "scale": 0.3}]
    for case in cases:
        arguments = {name: keras.ops.convert_to_tensor(value) for name, value in case.items() if name != "scale"}
        if "scale" in case:
            arguments["scale"] = case["scale"]

        def attend():
            heads = keras.ops.convert_to_tensor(cache)
            keys = keras.ops.transpose(heads, (0, 2, 1, 3))  # a view under torch
            queries = keras.ops.convert_to_tensor(query)
            return to_numpy(keras.ops.dot_product_attention(queries, keys, keys * 2.0, **arguments))

        expected = attend()
        with _direct_layer_calls():
            got = attend()
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        assert np.all(np.isfinite(got))


def test_attention_over_a_cache_while_decoding_directly_equals_the_written_out_softmax(monkeypatch):
    """Under torch, while decoding directly, attention over a heads-major
    cache is torch's fused attention; elsewhere it stays written out. Either
    way it equals the softmax of `MultiHeadAttention`, a query that may
    attend to no key included."""
    layer = kt.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    layer.build((2, 3, 8), (2, 5, 8))
    rng = np.random.default_rng(0)
    query = keras.ops.convert_to_tensor(rng.normal(size=(2, 3, 2, 4)).astype("float32"))
    key, value = (
        keras.ops.convert_to_tensor(rng.normal(size=(2, 2, 5, 4)).astype("float32"))
        for _ in range(2)
    )  # [B, N, S, H]
    mask = rng.random((2, 3, 5)) < 0.6
    mask[0, 1] = False
    fused_calls = []
    if keras.backend.backend() == "torch":
        import torch

        fused = torch.nn.functional.scaled_dot_product_attention

        def counted(*args, **kwargs):
            fused_calls.append(1)
            return fused(*args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    for case_mask in (None, keras.ops.convert_to_tensor(mask)):
        expected = to_numpy(layer._attend_to_cache(query, key, value, case_mask))
        with _direct_layer_calls():
            got = to_numpy(layer._attend_to_cache(query, key, value, case_mask))
        attends = np.ones((2, 3), bool) if case_mask is None else mask.any(-1)
        np.testing.assert_allclose(got[attends], expected[attends], rtol=1e-5, atol=1e-6)
    assert len(fused_calls) == (2 if keras.backend.backend() == "torch" else 0)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="loop tracing exists under torch only (torch.jit.trace); TensorFlow and JAX compile the whole "
    "search, which test_the_compiled_search_equals_the_search_through_keras_layer_calls checks on them",
)
def test_traced_loops_replay_with_each_calls_tensors_and_trace_again_for_new_constants():
    """Under torch, while decoding directly with `_TracedLoops`, a
    `while_loop` traces its condition and body once and replays them. Each
    call must bring its own tensors (the loop's and those its functions
    close over); a Python number in a closure is part of the trace, so a
    new one traces again; loop variables, and a tensor of the closure, that
    start as one tensor must still part; a closure holding a NumPy array is
    not traced."""
    import torch

    layer = keras.layers.Dense(3)
    layer.build((None, 3))
    loops = _TracedLoops(layer)
    rng = np.random.default_rng(0)

    def run(start, shift, limit):
        shift = keras.ops.convert_to_tensor(shift)
        x = keras.ops.convert_to_tensor(start)

        def condition(i, x, y):
            return keras.ops.less(i, limit)

        def body(i, x, y):  # reads the first x too, the loop's x at the start
            return i + 1, layer(x) + shift + first, y * 2.0 + x

        first = x
        return keras.ops.while_loop(condition, body, (keras.ops.convert_to_tensor(0), x, x))

    def check(start, shift, limit):
        expected = run(start, shift, limit)
        with torch.no_grad(), _direct_layer_calls(loops=loops):
            got = run(start, shift, limit)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-6)

    def draw():
        return rng.normal(size=(2, 3)).astype("float32")

    check(draw(), draw(), 3)
    assert (loops.count, loops.refused) == (2, 0)
    check(draw(), draw(), 3)
    assert loops.count == 2
    check(draw(), draw(), 4)
    assert loops.count == 3  # the condition's limit is new; the body is as before
    with torch.no_grad(), _direct_layer_calls(loops=loops):
        array = draw()
        i, x, y = keras.ops.while_loop(
            lambda i, x, y: keras.ops.less(i, 2),
            lambda i, x, y: (i + 1, x + array, y),
            (keras.ops.convert_to_tensor(0), keras.ops.convert_to_tensor(array), keras.ops.convert_to_tensor(array)),
        )
    np.testing.assert_allclose(to_numpy(x), 3 * array, rtol=1e-6)
    assert (loops.count, loops.refused) == (3, 0)  # not tried: Keras's loop runs it


def same_outside_and_while_decoding_directly(compute):
    """`compute()` inside `_direct_layer_calls`, checked against it outside:
    the same dtypes and values."""
    expected = compute()
    with _direct_layer_calls():
        got = compute()
    for g, e in zip(got, expected, strict=True):
        assert keras.backend.standardize_dtype(g.dtype) == keras.backend.standardize_dtype(e.dtype)
        np.testing.assert_array_equal(to_numpy(g), to_numpy(e))
    return got


def test_conversions_while_decoding_directly_equal_keras():
    """Under torch, while decoding directly, `convert_to_tensor` passes
    tensors through (decoding/compiled.py); on every backend the results
    must be Keras's, in value and dtype."""
    tensor = keras.ops.convert_to_tensor(np.arange(6, dtype="float32").reshape(2, 3))
    integers = keras.ops.convert_to_tensor(np.arange(3, dtype="int32"))
    variable = keras.Variable(np.ones((2,), "float32"))

    def conversions():
        return [
            keras.ops.convert_to_tensor(tensor),
            keras.ops.convert_to_tensor(tensor, "float32"),
            keras.ops.convert_to_tensor(tensor, "float16"),
            keras.ops.convert_to_tensor(integers, "float32"),
            keras.ops.convert_to_tensor(variable),
            keras.ops.convert_to_tensor(2.5),
            keras.ops.cast(integers, "int64"),
            keras.ops.add(integers, 1),
            keras.ops.add(tensor, integers),
        ]

    same_outside_and_while_decoding_directly(conversions)


def test_int8_products_while_decoding_directly_equal_keras():
    """Under torch on the CPU, while decoding directly, int8 by int8 matrix
    products (Keras's int8 `Dense` and `EinsumDense`, our int8 embedding's
    rows-by-rows logits) are int8 GEMMs (decoding/compiled.py); on every
    backend their int32 sums must be
    Keras's, for every form they take or leave to Keras."""
    rng = np.random.default_rng(0)

    def int8(*shape):
        return keras.ops.convert_to_tensor(rng.integers(-127, 128, shape).astype("int8"))

    x2, x3, heads = int8(5, 16), int8(2, 5, 16), int8(5, 4, 8)
    kernel, head_kernel, back_kernel = int8(16, 24), int8(16, 4, 8), int8(4, 8, 16)
    rows_kernel = keras.Variable(rng.integers(-127, 128, (24, 16)).astype("int8"), trainable=False)

    def products():
        return [
            keras.ops.matmul(x2, kernel),
            keras.ops.matmul(x3, kernel),
            keras.ops.einsum("td,dnh->tnh", x2, head_kernel),
            keras.ops.einsum("tnh,nhd->td", heads, back_kernel),
            # Rows by rows (our int8 embedding's logits), with the kernel as
            # a tensor and in a variable: `torch._int_mm` on its transpose.
            keras.ops.einsum("ab,cb->ac", x2, keras.ops.transpose(kernel)),
            keras.ops.einsum("td,vd->tv", x2, rows_kernel),
            keras.ops.einsum("ab,bc->ca", x2, kernel),  # neither form: Keras's
            keras.ops.matmul(keras.ops.cast(x2, "float32"), keras.ops.cast(kernel, "float32")),
        ]

    got = same_outside_and_while_decoding_directly(products)
    assert keras.backend.standardize_dtype(got[0].dtype) == "int32"
    assert np.abs(to_numpy(got[0])).max() > 127 * 127  # sums beyond int16
    if keras.backend.backend() == "torch":
        import torch

        with torch.profiler.profile() as profile, _direct_layer_calls():
            products()
        calls = collections.Counter(event.name for event in profile.events())
        assert calls["aten::_int_mm"] == 6


def test_float_einsum_products_while_decoding_directly_equal_keras():
    """Under torch, while decoding directly, an einsum of an input and a
    kernel in matrix-product form is one 2-D matrix product
    (decoding/compiled.py); on every backend it must give Keras's dtype and
    values, for a kernel held in a variable too, and leave other equations
    to Keras."""
    rng = np.random.default_rng(0)

    def floats(*shape):
        return keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))

    x2, x3, heads = floats(5, 16), floats(2, 5, 16), floats(5, 4, 8)
    head_kernel, back_kernel = floats(16, 4, 8), floats(4, 8, 16)
    variable = keras.Variable(rng.normal(size=(16, 4, 8)).astype("float32"))

    def products():
        return [
            keras.ops.einsum("td,dnh->tnh", x2, head_kernel),
            keras.ops.einsum("btd,dnh->btnh", x3, head_kernel),
            keras.ops.einsum("tnh,nhd->td", heads, back_kernel),
            keras.ops.einsum("td,dnh->tnh", x2, variable),
            keras.ops.einsum("td,dnh->thn", x2, head_kernel),  # not a product form: Keras's
        ]

    expected = products()
    with _direct_layer_calls():
        got = products()
    for g, e in zip(got, expected, strict=True):
        assert keras.backend.standardize_dtype(g.dtype) == keras.backend.standardize_dtype(e.dtype)
        assert tuple(g.shape) == tuple(e.shape)
        np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-5, atol=1e-5)


def test_large_float_products_while_decoding_directly_equal_keras(monkeypatch):
    """Under torch on the CPU, while decoding directly, float32 products of
    at least `ONEDNN_MIN_PRODUCT` multiply-adds go to oneDNN's linear
    operation, and smaller ones to `torch.matmul` (decoding/compiled.py);
    on every backend they must equal Keras's products, and under torch a
    loop whose body holds one must be traced, not refused."""
    # oneDNN's path, which torch takes on every CPU but an Intel one
    # (test_torch_products.py checks that rule).
    monkeypatch.setattr(torch_products, "onednn_preferred", lambda: True)
    rng = np.random.default_rng(0)

    def floats(*shape):
        return keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))

    x3, row, small = floats(2, 16, 64), floats(1, 64), floats(5, 16)
    kernel, head_kernel, small_kernel = floats(64, 1024), floats(64, 16, 64), floats(16, 24)
    embeddings = keras.Variable(rng.normal(size=(32768, 64)).astype("float32"))
    assert 32 * 64 * 1024 >= ONEDNN_MIN_PRODUCT > 64 * 1024

    def products():
        return [
            keras.ops.matmul(x3, kernel),  # 32 rows
            keras.ops.matmul(keras.ops.reshape(x3, (32, 64)), keras.ops.transpose(embeddings)),  # logits
            keras.ops.matmul(row, keras.ops.transpose(embeddings)),  # one row, 512 times wider than deep
            keras.ops.einsum("btd,dnh->btnh", x3, head_kernel),
            keras.ops.matmul(row, kernel),  # one row, below the size
            keras.ops.matmul(small, small_kernel),
        ]

    expected = products()
    with _direct_layer_calls():
        got = products()
    for g, e in zip(got, expected, strict=True):
        assert keras.backend.standardize_dtype(g.dtype) == "float32"
        assert tuple(g.shape) == tuple(e.shape)
        np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-5, atol=1e-4)
    if keras.backend.backend() != "torch":
        return
    import torch

    with torch.profiler.profile() as profile, _direct_layer_calls():
        products()
    calls = collections.Counter(event.name for event in profile.events())
    assert calls["mkldnn::_linear_pointwise"] == 4
    assert calls["aten::mm"] == 2

    loops = _TracedLoops(keras.layers.Dense(1))

    def run():
        return keras.ops.while_loop(
            lambda i, x: keras.ops.less(i, 2),
            lambda i, x: (i + 1, keras.ops.matmul(x, kernel)[:, :, :64] / 30.0),
            (keras.ops.convert_to_tensor(0), x3),
        )

    expected = run()
    with torch.no_grad(), _direct_layer_calls(loops=loops):
        got = run()
    assert (loops.count, loops.refused) == (2, 0)
    np.testing.assert_allclose(to_numpy(got[1]), to_numpy(expected[1]), rtol=1e-5, atol=1e-5)


def test_input_quantization_while_decoding_directly_equals_keras():
    """Under torch, while decoding directly, the int8 layers' quantization
    of their inputs runs in torch's own operations (decoding/compiled.py);
    on every backend it must give Keras's int8 values and scales, for rows
    of zeros, halves that round to even, and either axis."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 16)).astype("float32")
    x[1] = 0.0
    x[2] = np.arange(16) - 7.75  # scale 127 / 8.25; halves below
    x[3] = np.concatenate([[63.5], np.arange(15) / 2 - 3.25])  # scale 2: x.5 everywhere
    x = keras.ops.convert_to_tensor(x)
    quantizer = keras.quantizers.AbsMaxQuantizer(axis=-1)

    def quantize():
        return [quantizer(x), quantizer(x, axis=0), keras.quantizers.abs_max_quantize(x, -1)]

    expected = quantize()
    with _direct_layer_calls():
        got = quantize()
    for (values, scale), (expected_values, expected_scale) in zip(got, expected):
        assert keras.backend.standardize_dtype(values.dtype) == "int8"
        np.testing.assert_array_equal(to_numpy(values), to_numpy(expected_values))
        np.testing.assert_array_equal(to_numpy(scale), to_numpy(expected_scale))


def test_custom_gradient_functions_while_decoding_directly_return_their_output():
    """Under torch, while decoding directly, a function with a custom
    gradient (each int8 layer's product) is called without Keras's
    `torch.autograd.Function` (decoding/compiled.py); on every backend it
    must return what it returns outside."""

    def tripled(x):  # decorated at each call, as Keras's int8 layers do
        @keras.ops.custom_gradient
        def product(x):
            def gradient(*args, upstream=None):
                upstream = args[0] if upstream is None else upstream
                return upstream * 3.0

            return x * 3.0, gradient

        return product(x)

    x = keras.ops.convert_to_tensor(np.arange(4, dtype="float32"))
    expected = to_numpy(tripled(x))
    with _direct_layer_calls():
        got = tripled(x)
    np.testing.assert_array_equal(to_numpy(got), expected)
    np.testing.assert_array_equal(expected, np.arange(4) * 3.0)


def test_matrix_product_form_of_einsum_equations():
    assert matrix_product_form("td,dnh->tnh") == 1
    assert matrix_product_form("tnh,nhd->td") == 2
    assert matrix_product_form("abc,cd->abd") == 1
    for equation in ("ab,cb->ac", "ab,bc->ca", "btnh,bsnh->bnts", "a,a->", "...d,dn->...n", "ab,bc,cd->ad", "aab,bc->ac"):
        assert matrix_product_form(equation) is None, equation


def test_remembered_dtype_functions_remember_only_while_decoding_directly():
    """The dtype functions remember their answers while decoding directly,
    except for None (the float type of the moment), unhashable dtypes and
    errors, which they ask again every time."""
    calls = []

    def standardize(dtype):
        calls.append(dtype)
        if dtype == "float33":
            raise ValueError(f"Invalid dtype: {dtype}")
        return keras.config.floatx() if dtype is None else str(dtype)

    remembering = _remembered(standardize)
    assert remembering("int32") == remembering("int32") == "int32"
    assert calls == ["int32", "int32"]  # outside the block: asked each time
    calls.clear()
    with _direct_layer_calls():
        for _ in range(3):
            assert remembering("int32") == "int32"
            assert remembering(["int32"]) == "['int32']"
            with pytest.raises(ValueError, match="float33"):
                remembering("float33")
        keras.config.set_floatx("float16")
        try:
            assert remembering(None) == "float16"
        finally:
            keras.config.set_floatx("float32")
        assert remembering(None) == "float32"
    assert calls.count("int32") == 1
    assert calls.count(["int32"]) == 3 and calls.count("float33") == 3 and calls.count(None) == 2


def test_a_second_batch_of_the_same_bucket_is_not_traced_again(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, batch_size=2, max_extra_length=4)

    def shape(texts):
        sources = translator._source_ids(texts)
        return translator._batch(list(sources.values()), rows_wanted=2)[0].shape

    pairs = [SENTENCES[i : i + 2] for i in range(len(SENTENCES) - 1)]
    first, second = next(
        (a, b) for a, b in itertools.combinations(pairs, 2) if shape(a) == shape(b) and all(t.strip() for t in a + b)
    )  # two different batches of one bucket
    translator.translate(first)
    loops = translator._search.loops
    traced_loops = loops and loops.count
    translator.translate(second)
    # torch has no compiled search: it runs the search on every call, and
    # traces the loops of a shape once (a condition and a body per phase of
    # the growing caches).
    assert translator._search.traces == (2 if keras.backend.backend() == "torch" else 1)
    if keras.backend.backend() == "torch":
        assert traced_loops >= 2
        assert loops.count == traced_loops


def test_a_search_over_many_shapes_is_traced_once_per_shape(model):
    """A translator meets many shapes: buckets of source lengths, each with
    a loop per phase of its growing caches. Searched again, none is traced
    again (under torch, whose loop traces are kept per shape, as under JAX,
    whose functions are compiled per shape)."""
    never = model.vocabulary_size + 1  # no EOS: every search runs to its limit

    def search(source_ids, limits):
        return search_translations(
            model, source_ids, limits, beam_size=1, alpha=0.6, max_extra_length=40,
            bos_id=1, eos_id=never,
        )

    compiled = CompiledFunction(search, model, [2, 1])
    rng = np.random.default_rng(0)
    batches = []
    for width in (4, 6, 8, 10, 12, 14):
        source_ids = rng.integers(3, model.vocabulary_size, (1, width)).astype("int32")
        batches.append((source_ids, np.array([width + 40], "int32")))
    for source_ids, limits in batches:
        compiled(source_ids, limits)
    traces = compiled.traces
    loops = compiled.loops and compiled.loops.count
    if compiled.loops is not None:
        # The premise: a condition and a body for each of 3 phases (16, 32,
        # width + 40) of 6 widths, more than a few.
        assert loops == 6 * 3 * 2
    for source_ids, limits in batches:
        compiled(source_ids, limits)
    if compiled.loops is not None:
        assert compiled.loops.count == loops
    else:
        assert compiled.traces == traces


def test_empty_blank_and_unknown_characters_are_translated_not_fatal(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=4)
    texts = ["", " \t ", "日本語 😀 ∑", "the man ."]
    translations = translator.translate(texts)
    assert len(translations) == 4 and all(isinstance(t, str) for t in translations)
    assert translations[:2] == ["", ""]
    assert translator.n_best([""]) == [[("", 0.0)]]


def test_over_long_lines_are_truncated_with_a_warning(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=4, max_source_length=12)
    long_line = " ".join(["the old man sees the dog ."] * 6)
    with pytest.warns(UserWarning, match=r"Line 2 \(texts\[1\]\) has \d+ subword tokens, more than max_source_length=12"):
        translations = translator.translate(["the man .", long_line])
    truncated = tokenizer.detokenize(tokenizer.tokenize(long_line)[:11])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert translator.translate([truncated]) == translations[1:]


def test_bad_inputs_get_clear_errors(model, tokenizer):
    translator = Translator(model, tokenizer)
    with pytest.raises(TypeError, match="takes a list of strings. Received a single str"):
        translator.translate("the man .")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a string. Received: int 5"):
        translator.translate(["the man .", 5])
    with pytest.raises(ValueError, match=r"texts\[0\] is not valid UTF-8"):
        translator.translate([b"\xff\xfe"])
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1. Received: beam_size=0"):
        Translator(model, tokenizer, beam_size=0)
    for alpha in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"alpha must be a finite number >= 0. Received: alpha={alpha}"):
            Translator(model, tokenizer, alpha=alpha)
    small = SubwordTokenizer.train(builtin_corpus("train", size=100, seed=1), 350)
    with pytest.raises(ValueError, match="disagree on the vocabulary"):
        Translator(model, small)
    with pytest.raises(FileNotFoundError, match="No model.keras in"):
        Translator.load("/nonexistent/run")


def test_save_and_load_keep_the_model_vocabulary_and_settings(model, tokenizer, tmp_path):
    translator = Translator(model, tokenizer, beam_size=3, alpha=0.8, max_extra_length=5)
    translator.save(tmp_path)
    loaded = Translator.load(tmp_path)
    assert loaded.get_config() == translator.get_config()
    sentences = [s for s in SENTENCES if s.strip()][:4]
    assert loaded.translate(sentences) == translator.translate(sentences)
    assert Translator.load(tmp_path, beam_size=1).beam_size == 1


def test_a_model_file_replaced_by_another_keras_model_is_one_error(model, tokenizer, tmp_path):
    """translate and export used to print an AttributeError traceback."""
    Translator(model, tokenizer).save(tmp_path)
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="classifier")
    other.save(tmp_path / "model.keras")
    with pytest.raises(ValueError, match=r"model.keras holds a Sequential \('classifier'\), not a keras_transformer Transformer"):
        Translator.load(tmp_path)
    from keras_transformer.cli import main

    for command in (["translate", "--model-dir", str(tmp_path), "--input", "-"], ["export", "--model-dir", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert str(exit_info.value.code).startswith("error: ") and "holds a Sequential" in str(exit_info.value.code)


def test_cross_attention_map_rows_are_distributions_over_the_source(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=6)
    translation, source_pieces, target_pieces, weights = cross_attention_map(translator, SENTENCES[0])
    assert source_pieces[-1] == "</s>" and "".join(source_pieces[:-1]).replace("▁", " ").strip() == SENTENCES[0]
    assert weights.shape == (len(target_pieces), len(source_pieces))
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
    assert translation == translator.translate([SENTENCES[0]])[0]
    # Padding the source does not move any weight onto the padding.
    source_ids = source_batch(tokenizer, SENTENCES[:1])
    padded = np.pad(source_ids, [(0, 0), (0, 3)])
    decoder_input = np.array([[tokenizer.bos_id, 10, 11]], "int32")
    unpadded_weights = to_numpy(model.cross_attention_weights(source_ids, decoder_input)[-1])
    padded_weights = to_numpy(model.cross_attention_weights(padded, decoder_input)[-1])
    np.testing.assert_allclose(padded_weights[..., : source_ids.shape[1]], unpadded_weights, atol=1e-6)
    assert np.all(padded_weights[..., source_ids.shape[1] :] == 0)


def test_attention_plot_is_a_png_heatmap(model, tokenizer, tmp_path):
    from matplotlib.image import imread

    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=6)
    short_path, long_path = tmp_path / "short.png", tmp_path / "long.png"
    plot_cross_attention(translator, "the cat .", short_path)
    plot_cross_attention(translator, SENTENCES[6], long_path)
    short, long = imread(short_path), imread(long_path)
    assert open(short_path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert long.shape[1] > short.shape[1]  # one column per source piece
    with pytest.raises(ValueError, match="nothing to plot for an empty"):
        plot_cross_attention(translator, "  ", tmp_path / "empty.png")


@pytest.fixture(scope="module")
def model_dir(model, tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("translator")
    Translator(model, tokenizer, beam_size=2, max_extra_length=6).save(directory)
    return directory


def test_cli_translates_a_file_line_by_line(model_dir, tmp_path, capsys):
    source = tmp_path / "input.en"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    output = tmp_path / "output.de"
    cli.main(["translate", "--model-dir", str(model_dir), "--input", str(source), "--output", str(output)])
    lines = output.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(SENTENCES)
    expected = Translator.load(model_dir).translate(SENTENCES)
    assert lines[:-1] == expected


def test_cli_evaluate_prints_bleu_chrf_and_signatures(model_dir, tmp_path, capsys):
    import sacrebleu

    sources = [s for s in SENTENCES if s.strip()]
    references = [f"Referenz {i} ." for i in range(len(sources))]
    (tmp_path / "test.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    cli.main([
        "evaluate", "--model-dir", str(model_dir), "--source", str(tmp_path / "test.en"),
        "--reference", str(tmp_path / "test.de"), "--output", str(tmp_path / "hyp.de"),
    ])
    printed = capsys.readouterr().out
    hypotheses = (tmp_path / "hyp.de").read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    assert f"BLEU = {bleu.score:.2f}" in printed
    assert "chrF2 = " in printed
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in printed
    assert f"{len(sources)} sentences" in printed and "beam 2, alpha 0.6" in printed


def test_cli_reports_bad_files(model_dir, tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="a.en has 2 lines but .*a.de has 1"):
        cli.main(["evaluate", "--model-dir", str(model_dir), "--source", str(tmp_path / "a.en"),
                  "--reference", str(tmp_path / "a.de")])
    (tmp_path / "bad.en").write_bytes(b"fine\nnot \xff utf-8\n")
    with pytest.raises(SystemExit, match=r"bad.en:2: invalid UTF-8"):
        cli.main(["translate", "--model-dir", str(model_dir), "--input", str(tmp_path / "bad.en")])
    with pytest.raises(SystemExit, match="No model.keras in"):
        cli.main(["translate", "--model-dir", str(tmp_path / "missing")])
    for value in ("nan", "inf", "-1"):
        with pytest.raises(SystemExit, match=f"error: alpha must be a finite number >= 0. Received: alpha={value}"):
            cli.main(["translate", "--model-dir", str(model_dir), "--alpha", value])


def test_cli_reports_damaged_model_directories_and_other_mistakes_in_one_line(model_dir, tmp_path):
    import shutil

    def damaged(name, file, content):
        directory = tmp_path / name
        shutil.copytree(model_dir, directory)
        (directory / file).write_bytes(content)
        return directory

    whole = (model_dir / "model.keras").read_bytes()
    (tmp_path / "in.en").write_text("the man .\n", encoding="utf-8")
    for directory, message in (
        (damaged("cut", "model.keras", whole[: len(whole) // 2]), r"cut/model.keras cannot be read as a Keras model \(not a zip archive\)"),
        (damaged("text", "model.keras", b"not a model"), r"text/model.keras cannot be read as a Keras model"),
        (damaged("vocabulary", "subword.model", b"\x08garbage"), r"vocabulary/subword.model cannot be read as a SentencePiece model"),
        (damaged("json", "translator.json", b"{beam_size: 4"), r"json/translator.json is not valid JSON"),
        (damaged("list", "translator.json", b"[4]"), r"list/translator.json must hold a JSON object; it holds list"),
        (damaged("setting", "translator.json", b'{"beam_size": "x"}'), r"setting/translator.json: beam_size must be an integer >= 1. Received: beam_size='x'"),
    ):
        with pytest.raises(SystemExit, match=f"^error: .*{message}"):
            cli.main(["translate", "--model-dir", str(directory), "--input", str(tmp_path / "in.en")])
    # A setting given now is named as given, not blamed on the file.
    with pytest.raises(SystemExit, match=r"^error: beam_size must be an integer >= 1. Received: beam_size=0"):
        cli.main(["translate", "--model-dir", str(model_dir), "--input", str(tmp_path / "in.en"), "--beam-size", "0"])
    for layer in ("2", "-3"):  # the tiny model has 2 decoder blocks
        with pytest.raises(SystemExit, match=rf"^error: The model has 2 decoder blocks, so layer must be an integer from -2 to 1 \(-1 is the last\). Received: layer={layer}"):
            cli.main(["plot-attention", "--model-dir", str(model_dir), "--text", "the man .", "--output", str(tmp_path / "a.png"), "--layer", layer])
    (tmp_path / "empty.en").write_bytes(b"")
    (tmp_path / "empty.de").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"^error: .*empty.en has no lines; expected a test set"):
        cli.main(["evaluate", "--model-dir", str(model_dir), "--source", str(tmp_path / "empty.en"), "--reference", str(tmp_path / "empty.de")])
    # A write that fails late (here: a full device) names the file.
    if os.path.exists("/dev/full"):
        with pytest.raises(SystemExit, match=r"^error: Cannot write /dev/full: No space left on device"):
            cli.main(["translate", "--model-dir", str(model_dir), "--input", str(tmp_path / "in.en"), "--output", "/dev/full"])


def test_cli_plot_attention_writes_a_png(model_dir, tmp_path, capsys):
    path = tmp_path / "attention.png"
    cli.main(["plot-attention", "--model-dir", str(model_dir), "--text", SENTENCES[0], "--output", str(path)])
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert f"Saved the cross-attention heatmap to {path}" in capsys.readouterr().out


def run_command(*args, stdin="", **environment):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_TRANSFORMER_QUIET")}
    return subprocess.run(
        [sys.executable, "-m", "keras_transformer", *map(str, args)],
        input=stdin.encode(), capture_output=True, timeout=300, env=env | environment,
    )


def test_python_dash_m_reads_stdin_and_writes_stdout_quietly(model_dir):
    result = run_command("translate", "--model-dir", model_dir, stdin="the man .\n\nthe dog .\n")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    lines = result.stdout.decode("utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    # No TensorFlow, XLA or SentencePiece log line reaches the user.
    assert result.stderr.decode() == ""


def test_cli_warnings_are_one_line_and_count_lines_from_one(model_dir):
    long_line = " ".join(["the old man sees the dog ."] * 60)
    result = run_command("translate", "--model-dir", model_dir, stdin=f"the man .\n{long_line}\n")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    stderr = result.stderr.decode().splitlines()
    assert len(stderr) == 1, stderr
    assert stderr[0].startswith("warning: Line 2 (texts[1]) has ")
    assert "max_source_length=256" in stderr[0]


def test_cli_checks_the_output_path_before_any_work(tmp_path):
    # The model directory does not exist either: the output is checked first.
    for output, message in (
        (tmp_path / "missing" / "out.de", "the directory .*missing does not exist"),
        (tmp_path, "is a directory"),
    ):
        for command in (["translate"], ["plot-attention", "--text", "x"],
                        ["evaluate", "--source", "a", "--reference", "b"]):
            with pytest.raises(SystemExit, match=message):
                cli.main([*command, "--model-dir", str(tmp_path / "nothing"), "--output", str(output)])


def test_version_and_help_are_quiet():
    import keras_transformer

    result = run_command("--version")
    assert result.returncode == 0
    assert result.stdout.decode().startswith(f"keras-transformer {keras_transformer.__version__} (keras ")
    assert result.stderr.decode() == ""
    result = run_command("translate", "--help")
    assert result.returncode == 0 and "--verbose" in result.stdout.decode()
    assert result.stderr.decode() == ""
