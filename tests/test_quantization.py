"""int8 decoding: Keras's weight quantization of a trained model."""

import keras
import numpy as np
import pytest
from conftest import in_one_pass, to_numpy

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import builtin_corpus
from keras_transformer.decoding import Translator
from keras_transformer.decoding import cached_step_function
from keras_transformer.models import quantized
from keras_transformer.models.quantization import quantization_mode

SENTENCES = ["the old man sees the dog .", "a woman helps the small child .", "the cat ."]


@pytest.fixture(scope="module")
def tokenizer():
    return SubwordTokenizer.train(builtin_corpus("train", size=300, seed=0), 400)


@pytest.fixture(scope="module")
def model(tokenizer):
    keras.utils.set_random_seed(3)
    return kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size)


@pytest.fixture(scope="module")
def int8(model):
    return quantized(model)


def batch(tokenizer):
    source_ids = np.array(
        [[17, 25, 40, 9, tokenizer.eos_id], [8, 60, tokenizer.eos_id, 0, 0]], "int32"
    )
    target_ids = np.array(
        [[tokenizer.bos_id, 17, 25, 40, 9], [tokenizer.bos_id, 8, 8, 60, 3]], "int32"
    )
    return {"source_ids": source_ids, "target_ids": target_ids}


def test_a_quantized_copy_has_int8_kernels_and_the_model_is_unchanged(model, int8, tokenizer):
    inputs = batch(tokenizer)
    before = to_numpy(model(inputs))
    assert quantization_mode(model) is None and quantization_mode(int8) == "int8"
    quantized_layers = [
        layer for layer in int8._flatten_layers() if getattr(layer, "quantization_mode", None)
    ]
    # Per block: 4 attention projections per attention, 2 feed-forward
    # layers; and the shared token embedding.
    expected = model.num_layers * (4 + 2) + model.num_layers * (8 + 2) + 1
    assert len(quantized_layers) == expected
    kernel = int8.encoder_blocks[0].self_attention.query_dense._kernel
    assert keras.backend.standardize_dtype(kernel.dtype) == "int8"
    embeddings = int8.source_embedding.embeddings
    assert keras.backend.standardize_dtype(embeddings.dtype) == "int8"
    assert int8.target_embedding is int8.output_projection is int8.source_embedding
    np.testing.assert_array_equal(to_numpy(model(inputs)), before)
    after = to_numpy(int8(inputs))
    # Close to the float model's logits, but not the same numbers.
    assert not np.array_equal(after, before)
    assert np.corrcoef(after.ravel(), before.ravel())[0, 1] > 0.99


def test_cached_int8_steps_equal_full_int8_recomputation(int8, tokenizer):
    inputs = batch(tokenizer)
    full = to_numpy(int8(inputs))
    step_fn, state = cached_step_function(int8, inputs["source_ids"], max_length=5)
    for index in range(5):
        logits, state = step_fn(inputs["target_ids"], index, state)
        # The output projection quantizes each decoder state on the fly: where
        # the two paths' float states differ in the last bit, an element can
        # round the other way, which moves a logit by up to max|x| / 127 *
        # max|E| (about 0.01 here). A step that missed the cache of the
        # earlier positions is off by more than 1.
        np.testing.assert_allclose(to_numpy(logits), full[:, index], atol=0.1)


def test_an_int8_model_saves_and_loads_quantized(int8, tokenizer, tmp_path):
    path = str(tmp_path / "int8.keras")
    int8.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert quantization_mode(loaded) == "int8"
    inputs = batch(tokenizer)
    np.testing.assert_allclose(to_numpy(loaded(inputs)), to_numpy(int8(inputs)), atol=1e-6)
    # Quantizing a quantized model again is a no-op, not a second rounding.
    assert quantized(loaded) is loaded


def test_a_translator_decodes_with_an_int8_copy_and_saves_it(model, tokenizer, tmp_path):
    """The int8 copy's search is checked against the same search run
    through Keras's layer calls in test_compiled.py; here, the copy and its
    saving."""
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=5, quantize="int8")
    assert quantization_mode(translator.model) == "int8" and quantization_mode(model) is None
    # Saved with its setting, it loads quantized.
    translator.save(tmp_path / "int8")
    loaded = Translator.load(tmp_path / "int8")
    assert loaded.quantize == "int8" and quantization_mode(loaded.model) == "int8"
    # The same int8 weights, so the same translations.
    for got, want in zip(loaded.model.get_weights(), translator.model.get_weights()):
        np.testing.assert_array_equal(got, want)


@in_one_pass("torch", "the command line's --quantize; each backend's int8 search is tested above in every pass")
def test_the_command_line_quantizes_a_float_translator(model, tokenizer, tmp_path, capsys):
    translations = Translator(model, tokenizer, beam_size=2, max_extra_length=5, quantize="int8").translate(SENTENCES)
    Translator(model, tokenizer, beam_size=2, max_extra_length=5).save(tmp_path / "float")
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n")
    cli.main(["translate", "--model-dir", str(tmp_path / "float"), "--input", str(source), "--quantize", "int8"])
    assert capsys.readouterr().out.splitlines() == translations


def test_unknown_quantization_modes_are_refused(model, tokenizer, tmp_path, capsys):
    message = r"quantize must be None or one of int8\. Received: quantize='int4'"
    with pytest.raises(ValueError, match=message):
        Translator(model, tokenizer, quantize="int4")
    with pytest.raises(ValueError, match=message):
        quantized(model, "int4")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "--model-dir", str(tmp_path), "--quantize", "float8"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'float8'" in capsys.readouterr().err


def test_the_int8_token_embedding_looks_up_and_projects_with_its_int8_rows():
    keras.utils.set_random_seed(5)
    d_model, vocabulary_size = 16, 40
    layer = kt.layers.TokenEmbedding(vocabulary_size, d_model)
    layer.build()
    matrix = to_numpy(layer.embeddings)
    ids = np.array([[3, 0, 39], [7, 7, 1]], "int32")
    states = np.random.default_rng(0).normal(size=(2, 3, d_model)).astype("float32")
    float_embedded, float_logits = to_numpy(layer(ids)), to_numpy(layer(states, reverse=True))
    layer.quantize("int8")
    assert layer.quantization_mode == "int8"
    rows, scale = to_numpy(layer.embeddings), to_numpy(layer.embeddings_scale)
    assert rows.dtype == np.int8 and scale.shape == (vocabulary_size,)
    # Each row is rounded to 127 steps of its largest magnitude.
    np.testing.assert_allclose(rows / scale[:, None], matrix, atol=np.abs(matrix).max() / 254 + 1e-7)
    np.testing.assert_array_equal(np.abs(rows).max(axis=1), 127)
    # A lookup is the dequantized row, scaled by sqrt(d_model).
    embedded = to_numpy(layer(ids))
    np.testing.assert_allclose(embedded, rows[ids] / scale[ids][..., None] * d_model**0.5, rtol=1e-6)
    np.testing.assert_allclose(embedded, float_embedded, atol=0.02 * np.abs(float_embedded).max())
    # The logits: states quantized per row, times the int8 rows, in integers.
    states_scale = 127 / np.abs(states).max(axis=-1, keepdims=True)
    quantized_states = np.round(states * states_scale)
    sums = quantized_states.astype("int64") @ rows.T.astype("int64")
    logits = to_numpy(layer(states, reverse=True))
    np.testing.assert_allclose(logits, sums / (states_scale * scale), rtol=1e-5, atol=1e-5)
    assert not np.array_equal(logits, float_logits)
    np.testing.assert_allclose(logits, float_logits, atol=0.03 * np.abs(float_logits).max())


def test_the_token_embedding_refuses_other_quantization_modes():
    layer = kt.layers.TokenEmbedding(10, 4)
    layer.build()
    with pytest.raises(NotImplementedError, match="int4"):
        layer.quantize("int4")
    assert layer.quantization_mode is None


def test_an_int8_embedding_saved_in_float_loads_quantized():
    """A model saved int8 before the token embedding quantized holds its
    float matrix: the quantized layer rounds it as it loads."""
    keras.utils.set_random_seed(6)
    float_layer = kt.layers.TokenEmbedding(30, 8)
    float_layer.build()
    matrix = to_numpy(float_layer.embeddings)
    expected = kt.layers.TokenEmbedding(30, 8)
    expected.build()
    expected.embeddings.assign(matrix)
    expected.quantize("int8")
    loaded = kt.layers.TokenEmbedding(30, 8, dtype="int8_from_float32")
    loaded.build()
    loaded.load_own_variables({"0": matrix})
    np.testing.assert_array_equal(to_numpy(loaded.embeddings), to_numpy(expected.embeddings))
    np.testing.assert_array_equal(to_numpy(loaded.embeddings_scale), to_numpy(expected.embeddings_scale))
    with pytest.raises(ValueError, match=r"expected embeddings of shape \(30, 8\)\. Received: \(30, 4\)"):
        loaded.load_own_variables({"0": matrix[:, :4]})


PRODUCTS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum")


def test_tensorflow_without_xla_decodes_int8_products_as_float_products(model, tokenizer):
    """TensorFlow's int8 by int8 `matmul` is 4-5 times slower than its
    float32 one on this CPU; so the decoding function traced without XLA
    multiplies the int8 values as float32 (backend/products.py). That the
    results are Keras's int8 ones is `test_compiled.py`'s compiled-against-
    eager test; here, that no product in the traced graph takes int8."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip(
            "TensorFlow only: JAX and torch trace no TensorFlow graph; torch's "
            "int8 products: test_backend_products.py::"
            "test_int8_products_while_decoding_equal_keras"
        )
    import tensorflow as tf

    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=4, quantize="int8")
    translator.translate(SENTENCES)
    graph = translator._search._call.get_concrete_function().graph.as_graph_def()
    nodes = list(graph.node) + [node for function in graph.library.function for node in function.node_def]
    products = [node for node in nodes if node.op in PRODUCTS]
    types = {
        tf.dtypes.as_dtype(node.attr[key].type).name
        for node in products for key in ("T", "Ta", "Tb") if key in node.attr
    }
    assert len(products) > 10 and types == {"float32"}


def int8_products_in(jaxpr):
    """The int8 by int8 `dot_general`s of a jaxpr and the jaxprs inside it
    (loop bodies, conditions, branches)."""
    from jax.extend import core

    found = []
    for equation in jaxpr.eqns:
        if equation.primitive.name == "dot_general" and all(
            str(v.aval.dtype) == "int8" for v in equation.invars
        ):
            found.append(equation)
        for parameter in equation.params.values():
            for inner in parameter if isinstance(parameter, (list, tuple)) else [parameter]:
                if isinstance(inner, core.ClosedJaxpr):
                    found += int8_products_in(inner.jaxpr)
                elif isinstance(inner, core.Jaxpr):
                    found += int8_products_in(inner)
    return found


def traced_int8_product_rows(compiled, *inputs):
    """How many rows (the input's axes that are not contracted) each int8
    by int8 product of `compiled`'s traced function multiplies: from the
    jaxpr under JAX, from the graph of XLA's `tf.function` under TensorFlow."""
    if keras.backend.backend() == "jax":
        import jax

        rows = []
        for product in int8_products_in(jax.make_jaxpr(compiled._traced)(*inputs).jaxpr):
            x, _ = product.invars
            (contracted, _), _ = product.params["dimension_numbers"]
            rows.append(int(np.prod([n for axis, n in enumerate(x.aval.shape) if axis not in contracted])))
        return rows
    import tensorflow as tf

    def graphs(graph, seen):
        """`graph` and the graphs of the functions inside it (loop bodies)."""
        if id(graph) not in seen:
            seen.add(id(graph))
            yield graph
            for function in graph._functions.values():
                yield from graphs(function.graph, seen)

    outer = compiled._call.get_concrete_function(*(tf.constant(x) for x in inputs)).graph
    rows = []
    for graph in graphs(outer, set()):
        for operation in graph.get_operations():
            if operation.type in PRODUCTS and operation.inputs[0].dtype == tf.int8:
                rows.append(int(np.prod(operation.inputs[0].shape.as_list()[:-1])))
    return rows


def test_under_xla_single_int8_rows_are_multiplied_beside_a_row_of_zeros():
    """XLA:CPU multiplies one int8 row several times slower than two
    (backend/products.py): in a function compiled by XLA, our int8 products
    multiply a single int8 row beside a row of zeros, as a matrix product,
    a matrix-product einsum and a rows-by-rows one, and leave products of
    several rows as they are. The int32 sums must be Keras's own."""
    if keras.backend.backend() == "torch":
        pytest.skip(
            "No XLA under torch: its int8 products are torch._int_mm "
            "(test_backend_products.py::test_int8_products_while_decoding_equal_keras)"
        )
    from keras_transformer.backend import products as backend_products
    from keras_transformer.decoding.compiled import CompiledFunction

    rng = np.random.default_rng(0)
    kernel = keras.ops.convert_to_tensor(rng.integers(-127, 128, (64, 96)).astype("int8"))
    head_kernel = keras.ops.convert_to_tensor(rng.integers(-127, 128, (64, 4, 24)).astype("int8"))
    embeddings = keras.ops.convert_to_tensor(rng.integers(-127, 128, (96, 64)).astype("int8"))

    def products(x, ours=True, decoding=None):
        x = keras.ops.cast(x, "int8")
        row = x[:1]
        if not ours:
            return [
                keras.ops.matmul(row, kernel),
                keras.ops.einsum("btd,dnh->btnh", row[:, None], head_kernel),
                keras.ops.einsum("td,vd->tv", row, embeddings),
                keras.ops.matmul(x, kernel),
            ]
        return [
            backend_products.int8_product(row, kernel, 1, decoding),
            backend_products.int8_product(row[:, None], head_kernel, 1, decoding),
            backend_products.int8_rows_by_rows(row, embeddings, decoding),  # our int8 logits' form
            backend_products.int8_product(x, kernel, 1, decoding),  # 5 rows: as they are
        ]

    compiled = CompiledFunction(products, keras.layers.Dense(1), input_ranks=(2,), jit_compile=True)
    x = rng.integers(-127, 128, (5, 64)).astype("int32")
    assert sorted(traced_int8_product_rows(compiled, x)) == [2, 2, 2, 5]
    for got, expected in zip(compiled(x), products(keras.ops.convert_to_tensor(x), ours=False), strict=True):
        assert keras.backend.standardize_dtype(got.dtype) == "int32"
        np.testing.assert_array_equal(got, to_numpy(expected))


def test_a_greedy_search_at_batch_1_under_xla_multiplies_no_single_int8_row(int8, tokenizer):
    """XLA:CPU multiplies one int8 row several times slower than two
    (backend/products.py), so a greedy search at batch 1 compiled by XLA
    (JAX, TensorFlow with `jit_compile`) multiplies each int8 row beside a
    row of zeros. No int8 product of the traced search may take a single
    row, and its ids must be those of the same search run eagerly, through
    Keras's own products."""
    if keras.backend.backend() == "torch":
        pytest.skip(
            "No XLA under torch: its int8 products are torch._int_mm "
            "(test_backend_products.py::test_int8_products_while_decoding_equal_keras)"
        )
    from keras_transformer.decoding import search_translations
    from keras_transformer.decoding.compiled import CompiledFunction

    source = np.array([[17, 25, 40, 9, tokenizer.eos_id]], "int32")
    limits = np.array([12], "int32")

    def search(source_ids, limit, decoding=None):
        return search_translations(
            int8, source_ids, limit, beam_size=1, alpha=0.6, max_extra_length=7,
            bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, decoding=decoding,
        )

    compiled = CompiledFunction(search, int8, input_ranks=(2, 1), jit_compile=True)
    rows = traced_int8_product_rows(compiled, source, limits)
    # The encoder's products take the source's 5 tokens (under TensorFlow
    # Keras multiplies some of them as float32 einsums, not counted here); a
    # step's (the decoder's projections and feed-forward layers, and the
    # logits) its one row and the row of zeros.
    assert 1 not in rows and rows.count(2) > 10 and rows.count(5) >= 4, rows

    ids, scores = compiled(source, limits)
    eager_ids, eager_scores = search(keras.ops.convert_to_tensor(source), keras.ops.convert_to_tensor(limits))
    np.testing.assert_array_equal(ids, to_numpy(eager_ids))
    np.testing.assert_allclose(scores, to_numpy(eager_scores), rtol=1e-5, atol=1e-5)
