"""Decoding functions compiled per backend (keras_transformer/decoding/compiled.py)."""

import itertools

import keras
import numpy as np
import pytest
from conftest import to_numpy, torch_operations
from translation_fixtures import SENTENCES
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)
from translation_fixtures import source_batch

import keras_transformer as kt
from keras_transformer.backend.options import DecodingOptions
from keras_transformer.decoding import Translator
from keras_transformer.decoding import search_translations
from keras_transformer.decoding.compiled import CompiledFunction
from keras_transformer.layers.calls import DirectCalls


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_the_compiled_search_equals_the_search_through_keras_layer_calls(model, tokenizer, quantize):
    """The `Translator`'s search is compiled under TensorFlow and JAX, and
    under torch calls each built layer's `call` (or int8 `quantized_call`)
    directly, runs its loops eagerly the first time, records them the
    second and replays the records after. Its beams and scores must be
    those of the same search run eagerly through `Layer.__call__`, for
    later batches of the same shape too (with other sentences and limits,
    which a record must take from that call); the model has dropout, which
    neither may apply."""
    assert model.dropout > 0
    translator = Translator(model, tokenizer, beam_size=3, max_extra_length=6, quantize=quantize)
    # The sentences of under 20 pieces: the eager search through Keras's calls takes a step per output
    # position, about 25 here against 42 with the longest sentences.
    pieces = tokenizer.tokenize(SENTENCES)
    sentences = [s for s, ids in zip(SENTENCES, pieces, strict=True) if s.strip() and len(ids) < 20]
    first = source_batch(tokenizer, sentences)
    second = source_batch(tokenizer, sentences[::-1])
    width = max(first.shape[1], second.shape[1])
    # Batches of the same shape, with other sentences and limits: torch
    # records its loops at the second and replays them at the third;
    # TensorFlow and JAX compile per shape.
    batches = (first, second, first) if keras.backend.backend() == "torch" else (first,)
    for number, source_ids in enumerate(batches):
        source_ids = np.pad(source_ids, ((0, 0), (0, width - source_ids.shape[1])))
        limits = (np.arange(len(source_ids), dtype="int32") + number) % 4 + width
        compiled_ids, compiled_scores = translator._search(source_ids, limits, tokenizer.eos_id)
        ids, scores = translator._search.fn(
            keras.ops.convert_to_tensor(source_ids), keras.ops.convert_to_tensor(limits), tokenizer.eos_id
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


def search_of_every_step(model, beam_size, steps):
    """A compiled search of two sentences that runs `steps` steps past
    their 5 tokens (EOS never ends it), called twice (which records its
    loops), and its inputs."""
    source_ids = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], "int32")
    search = CompiledFunction(
        lambda source, limits, decoding: search_translations(
            model, source, limits, beam_size=beam_size, alpha=0.6, max_extra_length=steps, bos_id=2, eos_id=-1,
            decoding=decoding,
        ),
        model, [2, 1],
    )  # fmt: skip
    limits = np.full((2,), 5 + steps, "int32")
    search(source_ids, limits)
    search(source_ids, limits)
    return search, source_ids, limits


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="counts what torch's step-by-step search reads back to the host; under TensorFlow and JAX the search is one compiled loop, which reads nothing back between steps")
@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_torch_search_reads_one_value_back_a_step(model, beam_size):
    """On a GPU, each tensor value read back to the host (`.item()`, a
    tensor start of a slice) waits for all the work queued before it, and
    the host cannot run ahead. A torch search reads only its loop's
    condition, once a step: the traced step reads its position, ids and
    cache writes where they are (it read a dozen values a step)."""
    import torch

    reads = {}
    for steps in (8, 16):
        search, source_ids, limits = search_of_every_step(model, beam_size, steps)
        with torch_operations() as dispatched:
            ids = to_numpy(search(source_ids, limits)[0])
        assert search.loops.count > 0 and np.count_nonzero(ids[:, 0] > 0, axis=1).min() >= steps
        # One read a step, and one ending each loop: one loop per phase of
        # the growing caches.
        phases = len(kt.decoding.cache_lengths(5 + steps) or [5 + steps])
        reads[steps] = dispatched.operations.count(torch.ops.aten._local_scalar_dense.default) - steps - phases
    assert reads[16] == reads[8], reads  # the rest: a few reads outside the loops


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="counts the kernels torch's step-by-step search launches; under TensorFlow and JAX the search is one compiled loop")
@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_torch_search_step_launches_only_each_block_s_arithmetic(beam_size):
    """On a GPU a torch decoding step is bound by the host's launches, one a
    kernel. A decoder block's share of a step (the step of a 3-block model
    less that of a 1-block one, halved) is its arithmetic alone: its masks
    and the cache positions it writes are derived once a step for all
    blocks, each product adds its bias in one kernel, the caches, which
    the search alone holds, are written without a copy, and the beams'
    caches are gathered without index arithmetic."""
    import collections

    import torch

    aten = torch.ops.aten
    no_kernel = {aten.empty.memory_format, aten.empty_strided.default, aten._unsafe_view.default, aten.scalar_tensor.default}

    def kernels_a_step(num_layers):
        keras.utils.set_random_seed(0)
        model = kt.build_transformer("tiny", vocabulary_size=40, num_layers=num_layers, d_model=16, d_ff=32, num_heads=2)
        counts = {}
        for steps in (4, 8):  # caches of at most 16 positions: one phase
            search, source_ids, limits = search_of_every_step(model, beam_size, steps)
            with torch_operations() as dispatched:
                search(source_ids, limits)
            counts[steps] = collections.Counter(
                str(op) for op in dispatched.operations if not (op.is_view or op in no_kernel)
            )
        counts[8].subtract(counts[4])
        return counts[8]

    per_block = kernels_a_step(3)
    per_block.subtract(kernels_a_step(1))
    per_block = {name: count / (2 * 4) for name, count in per_block.items() if count}
    assert per_block == {
        "aten.addmm.default": 8,  # self-attention's Q, K, V and output; cross-attention's Q and output; W_1, W_2
        "aten.add.Tensor": 3,  # the residual connections
        "aten.native_layer_norm.default": 3,
        "aten.index_copy_.default": 2,  # the step's keys and values, written into the search's caches
        "aten._scaled_dot_product_flash_attention_for_cpu.default": 2,
        "aten.mul.Tensor": 2,  # a query that may attend to no key attends to nothing
        "aten.relu.default": 1,
        **({"aten.index_select.default": 2} if beam_size > 1 else {}),  # the caches of the chosen beams
    }, per_block


def test_a_search_with_a_logits_bias_equals_keras_calls_and_under_torch_adds_it_in_place():
    """A converted Marian model's logits bias: the compiled search's beams
    and scores are those of the search through Keras's calls, on every
    backend; under torch's direct calls the bias is added into the step's
    new logits (no second `[rows, V]` tensor)."""
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(
        "tiny", vocabulary_size=40, num_layers=1, d_model=16, d_ff=32, num_heads=2, output_bias=True
    )
    model.logits_bias.bias.assign(np.random.default_rng(0).normal(scale=3.0, size=40).astype("float32"))
    search, source_ids, limits = search_of_every_step(model, beam_size=2, steps=4)
    if keras.backend.backend() == "torch":
        import collections

        import torch

        with torch_operations() as dispatched:
            ids, scores = search(source_ids, limits)
        bias = model.logits_bias.bias.value
        added = collections.Counter(
            str(op) for op, args in zip(dispatched.operations, dispatched.arguments)
            if len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].data_ptr() == bias.data_ptr()
        )
        assert added == {"aten.add_.Tensor": int(limits.max())}, added  # one a step, up to the limit
    else:
        ids, scores = search(source_ids, limits)
    expected_ids, expected_scores = search.fn(
        keras.ops.convert_to_tensor(source_ids), keras.ops.convert_to_tensor(limits), None
    )
    np.testing.assert_array_equal(ids, to_numpy(expected_ids))
    np.testing.assert_allclose(scores, to_numpy(expected_scores), atol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="only torch's traced search writes its caches in place; TensorFlow and JAX compile the search, and XLA reuses buffers itself")
def test_a_torch_search_of_one_sentence_writes_its_caches_in_place(model):
    """The beams of one sentence start from a broadcast view of its caches
    (Keras's torch `repeat` of one row), which cannot be written in place.
    The loop takes its variables contiguous, so that its traced step writes
    each cache in place, copying none a step, and finds what the search
    through Keras's calls finds."""
    import torch

    source_ids, limits = np.array([[5, 6, 7, 8, 3]], "int32"), np.array([12], "int32")

    def search(source, limits, decoding=None):
        return search_translations(
            model, source, limits, beam_size=4, alpha=0.6, max_extra_length=7, bos_id=2, eos_id=-1, decoding=decoding
        )

    compiled = CompiledFunction(search, model, [2, 1])
    compiled(source_ids, limits)  # eager
    compiled(source_ids, limits)  # records
    with torch_operations() as dispatched:
        ids, scores = compiled(source_ids, limits)
    assert compiled.loops.count > 0 and compiled.loops.refused == 0
    # A contiguous copy of each block's self-attention keys and values as
    # the loop starts (its caches fit one phase), none at the 7 steps.
    assert dispatched.operations.count(torch.ops.aten.clone.default) == 2 * model.num_layers
    want_ids, want_scores = search(keras.ops.convert_to_tensor(source_ids), keras.ops.convert_to_tensor(limits))
    np.testing.assert_array_equal(ids, to_numpy(want_ids))
    np.testing.assert_allclose(scores, to_numpy(want_scores), atol=1e-4)


def test_a_mixed_precision_model_decodes_through_keras_layer_calls():
    """Under mixed precision the layers need `Layer.__call__`'s dtype scope,
    so `CompiledFunction` must not call them directly (under torch, doing so
    fails on a bfloat16 input to a float32 kernel)."""
    # Seeded: a random model's logits nearly tie, and under JAX its float32
    # logits (not rounded to bfloat16) take XLA's fused bfloat16 work and
    # the eager one's apart, which flips a near-tied choice for 3 seeds in 12.
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = kt.build_transformer("tiny", vocabulary_size=300)
    finally:
        keras.config.set_dtype_policy("float32")
    source_ids = np.random.default_rng(0).integers(4, 300, (3, 7)).astype("int32")
    source_ids[:, -1] = 2
    limits = np.full((3,), 10, "int32")

    def search(source_ids, limits, decoding=None):
        return search_translations(
            model, source_ids, limits, beam_size=2, alpha=0.6, max_extra_length=4, bos_id=1, eos_id=2, decoding=decoding
        )

    compiled_ids, compiled_scores = CompiledFunction(search, model, [2, 1])(source_ids, limits)
    ids, scores = search(keras.ops.convert_to_tensor(source_ids), keras.ops.convert_to_tensor(limits))
    np.testing.assert_array_equal(compiled_ids, to_numpy(ids))
    np.testing.assert_allclose(compiled_scores, to_numpy(scores), rtol=5e-3)  # bfloat16: XLA fuses differently


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
    translator.translate(second)
    loops = translator._search.loops
    traced_loops = loops and loops.count
    translator.translate(first)
    # torch has no compiled search: it runs the search on every call, and
    # records the loops of a shape once, when it meets them a second time
    # (a condition and a body per phase of the growing caches).
    assert translator._search.traces == (3 if keras.backend.backend() == "torch" else 1)
    if keras.backend.backend() == "torch":
        assert traced_loops >= 2
        assert loops.count == traced_loops


def test_a_search_over_many_shapes_is_traced_once_per_shape(model):
    """A translator meets many shapes: buckets of source lengths, each with
    a loop per phase of its growing caches. Searched again, none is traced
    again (under torch, whose loop traces are kept per shape, as under JAX,
    whose functions are compiled per shape)."""
    never = model.vocabulary_size + 1  # no EOS: every search runs to its limit

    def search(source_ids, limits, decoding=None):
        return search_translations(
            model, source_ids, limits, beam_size=1, alpha=0.6, max_extra_length=40,
            bos_id=1, eos_id=never, decoding=decoding,
        )

    compiled = CompiledFunction(search, model, [2, 1])
    rng = np.random.default_rng(0)
    batches = []
    for width in (4, 9, 14):  # three shapes of three phases each: searches, not shapes, cost the time
        source_ids = rng.integers(3, model.vocabulary_size, (1, width)).astype("int32")
        batches.append((source_ids, np.array([width + 40], "int32")))
    for _ in range(2 if compiled.loops is not None else 1):  # torch records at the second meeting
        for source_ids, limits in batches:
            compiled(source_ids, limits)
    traces = compiled.traces
    loops = compiled.loops and compiled.loops.count
    if compiled.loops is not None:
        # The premise: a condition and a body for each of 3 phases (16, 32,
        # width + 40) of 3 widths, more than a few.
        assert loops == 3 * 3 * 2
    for source_ids, limits in batches:
        compiled(source_ids, limits)
    if compiled.loops is not None:
        assert compiled.loops.count == loops
    else:
        assert compiled.traces == traces


def test_our_built_layers_skip_keras_call_given_direct_decoding_options_only():
    """Given decoding options with direct calls (torch's decoding calls), a
    built layer of ours runs its `call` itself; an unbuilt one, a layer that
    is not ours, and a call without such options go through
    `Layer.__call__`. The options reach `call` where it takes them."""

    class Seen(keras.layers.Layer):
        def build(self, shape):
            self.built = True

        def call(self, x):
            self.seen = x
            return x

    class Ours(DirectCalls, Seen):
        pass

    class Passing(DirectCalls, Seen):
        def call(self, x, decoding=None):
            self.given = decoding
            return super().call(x)

    direct = DecodingOptions(direct=True)
    built, unbuilt, keras_s, passing = Ours(), Ours(), Seen(), Passing()
    for layer in (built, keras_s, passing):
        layer.build((2,))
    x = np.ones((1, 2), "float32")
    built(x, decoding=direct)
    assert built.seen is x  # `call` itself: Keras would convert x to a tensor
    unbuilt(x, decoding=direct)
    assert unbuilt.built and unbuilt.seen is not x  # built by Keras's own `__call__`
    for options in (None, DecodingOptions(direct=False)):
        built(x, decoding=options)
        assert built.seen is not x
    passing(x, decoding=direct)
    assert passing.seen is x and passing.given is direct
    passing(x, decoding=DecodingOptions(xla=True))
    assert passing.seen is not x and passing.given.xla
    passing(x)
    assert passing.given is None
    with pytest.raises(TypeError):
        keras_s(x, decoding=direct)  # not ours: Keras's call takes no options
