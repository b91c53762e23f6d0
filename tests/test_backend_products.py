"""Products of inputs and kernels per backend (keras_transformer/backend/products.py)."""

import collections

import keras
import numpy as np
import pytest
from conftest import to_numpy

import keras_transformer as kt
from keras_transformer.backend import products as backend_products
from keras_transformer.backend.options import DecodingOptions
from keras_transformer.backend.products import ONEDNN_MIN_PRODUCT
from keras_transformer.backend.products import matrix_product_form

torch_only = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="torch only: TensorFlow multiplies through oneDNN already, and JAX through XLA; "
    "test_large_float_products_while_decoding_equal_keras checks the same products' values "
    "on every backend",
)


@pytest.fixture
def onednn_on_any_cpu(monkeypatch):
    """oneDNN's path, which the package takes on every CPU but an Intel one
    (`onednn_preferred`); test_on_an_intel_cpu_... checks that rule."""
    monkeypatch.setattr(backend_products, "onednn_preferred", lambda: True)


def onednn_calls(compute):
    """`compute()`'s result, and how many oneDNN linear operations and
    torch products (`mm`, or `addmm` with a bias) it ran, forward and
    backward."""
    import torch

    with torch.profiler.profile() as profile:
        result = compute()
    calls = collections.Counter(event.name for event in profile.events())
    return result, calls["mkldnn::_linear_pointwise"], calls["aten::mm"] + calls["aten::addmm"]


def gradients_of(model, inputs, weights):
    """The model's logits and the gradients of a fixed random function of
    them with respect to its weights and its float inputs."""
    import torch

    logits = model(inputs, training=False)
    mix = torch.as_tensor(np.random.default_rng(1).normal(size=tuple(logits.shape)).astype("float32"))
    loss = (logits * mix).sum()
    return [logits.detach(), *torch.autograd.grad(loss, weights)]


@torch_only
def test_the_model_s_products_and_gradients_through_onednn_equal_torch_s(monkeypatch, onednn_on_any_cpu):
    """The products in our layers' calls (attention projections, the
    feed-forward layers, the tied output projection) go to oneDNN, forward
    and backward, and the logits and every weight's gradient must equal
    those computed with torch's own products."""
    keras.utils.set_random_seed(0)
    # 4 x 16 target tokens: every projection is 64 x 128 x 128 = 2^20
    # multiply-adds, the smallest that oneDNN takes.
    model = kt.build_transformer(
        "tiny", vocabulary_size=4096, d_model=128, d_ff=512, num_heads=4, num_layers=2, dropout=0.0
    )
    rng = np.random.default_rng(0)
    inputs = {
        "source_ids": rng.integers(4, 4096, (4, 16)).astype("int32"),
        "target_ids": rng.integers(4, 4096, (4, 16)).astype("int32"),
    }
    weights = [v.value for v in model.trainable_variables]

    through_onednn, onednn, _ = onednn_calls(lambda: gradients_of(model, inputs, weights))
    # Forward: 4 attention projections x 3 attention layers, 2 feed-forward
    # products x 4 blocks, the logits: 21; backward: the weights' 21 and the
    # inputs' 20 (not the source's first layer's, whose input is the
    # embedding lookup's: that one is needed too, for the embedding).
    assert onednn >= 21 * 2 + 20

    monkeypatch.setattr(backend_products, "pays", lambda x, kernel: False)
    through_torch, onednn, mm = onednn_calls(lambda: gradients_of(model, inputs, weights))
    assert onednn == 0 and mm > 0
    names = ["logits"] + [v.path for v in model.trainable_variables]
    scale = max(np.abs(to_numpy(b)).max() for b in through_torch[1:])
    for name, a, b in zip(names, through_onednn, through_torch, strict=True):
        # Sums in another order: the tied embedding's gradient adds up
        # thousands of terms, some of which cancel, and the keys' bias has
        # a gradient of zero up to rounding (softmax ignores a shift).
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-4, atol=1e-5 * scale, err_msg=name)


@torch_only
def test_only_the_package_s_layers_change_and_small_products_stay_with_torch(onednn_on_any_cpu):
    """A Keras `Dense` outside our layers keeps Keras's product, and so do
    products under `ONEDNN_MIN_PRODUCT` multiply-adds inside them."""
    import torch

    dense = keras.layers.Dense(512)
    x = torch.randn(64, 128)
    _, onednn, mm = onednn_calls(lambda: dense(x))
    assert (onednn, mm) == (0, 1)

    small = kt.layers.PositionwiseFeedForward(d_ff=32)
    _, onednn, mm = onednn_calls(lambda: small(torch.randn(2, 4, 16)))
    assert (onednn, mm) == (0, 2)

    feed_forward = kt.layers.PositionwiseFeedForward(d_ff=512)
    x = torch.randn(4, 16, 128)
    y, onednn, mm = onednn_calls(lambda: feed_forward(x))
    assert (onednn, mm) == (2, 0)
    inner, outer = feed_forward.inner_dense, feed_forward.outer_dense
    with torch.no_grad():
        expected = torch.relu(x @ inner.kernel.value + inner.bias.value) @ outer.kernel.value + outer.bias.value
    np.testing.assert_allclose(to_numpy(y), to_numpy(expected), rtol=1e-4, atol=1e-5)


@torch_only
def test_a_mixed_bfloat16_layer_keeps_keras_s_products(onednn_on_any_cpu):
    """oneDNN's path is float32 only: under mixed_bfloat16 the products are
    Keras's bfloat16 ones."""
    import torch

    feed_forward = kt.layers.PositionwiseFeedForward(d_ff=512, dtype="mixed_bfloat16")
    y, onednn, _ = onednn_calls(lambda: feed_forward(torch.randn(4, 16, 128)))
    assert onednn == 0
    assert y.dtype == torch.bfloat16


@torch_only
@pytest.mark.parametrize(
    "vendor, mkl, through_onednn",
    [("AuthenticAMD", True, True), ("GenuineIntel", True, False), ("GenuineIntel", False, True), ("", True, True)],
)
def test_on_an_intel_cpu_the_products_stay_with_torch_s_mkl(monkeypatch, vendor, mkl, through_onednn):
    """torch's MKL multiplies as fast as oneDNN or faster on Intel's CPUs
    (backend/products.py): there, and only there, the layers'
    products stay torch's, in training and while decoding."""
    import torch

    from keras_transformer import environment

    monkeypatch.setattr(environment, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    backend_products.onednn_preferred.cache_clear()
    try:
        assert backend_products.onednn_preferred() is through_onednn
        feed_forward = kt.layers.PositionwiseFeedForward(d_ff=512)
        x = torch.randn(4, 16, 128)
        y, onednn, mm = onednn_calls(lambda: feed_forward(x))
        assert (onednn, mm) == ((2, 0) if through_onednn else (0, 2))
        with torch.no_grad():
            decoded, onednn, mm = onednn_calls(lambda: feed_forward(x, decoding=DecodingOptions(direct=True)))
        assert (onednn, mm) == ((2, 0) if through_onednn else (0, 2))
        np.testing.assert_allclose(to_numpy(decoded), to_numpy(y), rtol=1e-5, atol=1e-5)
    finally:
        backend_products.onednn_preferred.cache_clear()


# The three ways a decoding call is compiled: XLA (JAX, TensorFlow with
# `jit_compile`), TensorFlow without XLA, torch with direct calls.
DECODING_CALLS = [{"xla": True}, {"float_int8": True}, {"direct": True}]


@pytest.mark.parametrize("scope", DECODING_CALLS)
def test_int8_products_while_decoding_equal_keras(scope):
    """While decoding, int8 products are torch's int8 GEMM (torch on the
    CPU), float32 products of the int8 values (TensorFlow without XLA), or a
    single row paired with a row of zeros (XLA); on every backend their
    int32 sums must be Keras's, for every form our layers use."""
    rng = np.random.default_rng(0)

    def int8(*shape):
        return keras.ops.convert_to_tensor(rng.integers(-127, 128, shape).astype("int8"))

    x2, x3, heads, row = int8(5, 16), int8(2, 5, 16), int8(5, 4, 8), int8(1, 16)
    kernel, head_kernel, back_kernel = int8(16, 24), int8(16, 4, 8), int8(4, 8, 16)
    table = keras.Variable(rng.integers(-127, 128, (24, 16)).astype("int8"), trainable=False)
    ops = keras.ops
    options = DecodingOptions(**scope)
    cases = [
        (lambda: backend_products.int8_product(x2, kernel, 1, options), lambda: ops.matmul(x2, kernel)),
        (lambda: backend_products.int8_product(x3, kernel, 1, options), lambda: ops.matmul(x3, kernel)),
        (lambda: backend_products.int8_product(row, kernel, 1, options), lambda: ops.matmul(row, kernel)),
        (lambda: backend_products.int8_product(x2, head_kernel, 1, options), lambda: ops.einsum("td,dnh->tnh", x2, head_kernel)),
        (lambda: backend_products.int8_product(heads, back_kernel, 2, options), lambda: ops.einsum("tnh,nhd->td", heads, back_kernel)),
        (lambda: backend_products.int8_rows_by_rows(x2, table, options), lambda: ops.einsum("td,vd->tv", x2, table)),
        (lambda: backend_products.int8_rows_by_rows(row, table, options), lambda: ops.einsum("td,vd->tv", row, table)),
    ]
    for ours, keras_s in cases:
        expected = keras_s()
        got = ours()
        assert keras.backend.standardize_dtype(got.dtype) == "int32"
        np.testing.assert_array_equal(to_numpy(got), to_numpy(expected))
    assert np.abs(to_numpy(cases[0][1]())).max() > 127 * 127  # sums beyond int16
    if keras.backend.backend() == "torch" and scope.get("direct"):
        import torch

        with torch.profiler.profile() as profile:
            for ours, _ in cases:
                ours()
        calls = collections.Counter(event.name for event in profile.events())
        assert calls["aten::_int_mm"] == len(cases)


@pytest.mark.parametrize("scope", [None] + DECODING_CALLS)
def test_int8_sums_rescaled_equal_keras_and_under_torch_make_one_tensor(scope):
    """int32 sums divided by their row's and column's scales, on every
    backend as Keras's int8 layers divide them (to a float32 ulp or two);
    under torch's direct calls as one new tensor, the division in place."""
    rng = np.random.default_rng(0)
    sums = keras.ops.convert_to_tensor(rng.integers(-300_000, 300_000, (3, 2, 50)).astype("int32"))
    rows_scale = keras.ops.convert_to_tensor(rng.uniform(0.5, 90, (3, 2, 1)).astype("float32"))
    columns_scale = keras.Variable(rng.uniform(0.5, 90, (50,)).astype("float32"), trainable=False)
    options = None if scope is None else DecodingOptions(**scope)
    expected = to_numpy(sums).astype("float32") / (to_numpy(rows_scale) * to_numpy(columns_scale))

    def rescaled():
        return backend_products.int8_rescaled(sums, rows_scale, columns_scale, "float32", options)

    got = rescaled()
    assert keras.backend.standardize_dtype(got.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(got), expected, rtol=3e-7)
    if keras.backend.backend() == "torch" and options is not None and options.direct:
        import torch

        with torch.profiler.profile() as profile:
            rescaled()
        calls = collections.Counter(event.name for event in profile.events())
        assert (calls["aten::div"], calls["aten::div_"], calls["aten::mul"]) == (1, 1, 0)


def test_float_einsum_products_while_decoding_equal_keras():
    """While decoding under torch, an einsum of an input and a kernel in
    matrix-product form is one 2-D product; on every backend it must give
    Keras's dtype and values, for a kernel held in a variable too, and
    other equations are Keras's."""
    rng = np.random.default_rng(0)

    def floats(*shape):
        return keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))

    x2, x3, heads = floats(5, 16), floats(2, 5, 16), floats(5, 4, 8)
    head_kernel, back_kernel = floats(16, 4, 8), floats(4, 8, 16)
    variable = keras.Variable(rng.normal(size=(16, 4, 8)).astype("float32"))
    cases = [
        ("td,dnh->tnh", x2, head_kernel),
        ("btd,dnh->btnh", x3, head_kernel),
        ("tnh,nhd->td", heads, back_kernel),
        ("td,dnh->tnh", x2, variable),
        ("td,dnh->thn", x2, head_kernel),  # not a product form: Keras's
    ]
    for equation, x, kernel in cases:
        expected = keras.ops.einsum(equation, x, kernel)
        got = backend_products.einsum(equation, x, kernel, DecodingOptions(direct=True))
        assert keras.backend.standardize_dtype(got.dtype) == keras.backend.standardize_dtype(expected.dtype)
        assert tuple(got.shape) == tuple(expected.shape)
        np.testing.assert_allclose(to_numpy(got), to_numpy(expected), rtol=1e-5, atol=1e-5)


def test_large_float_products_while_decoding_equal_keras(monkeypatch):
    """While decoding under torch on the CPU, float32 products of at least
    `ONEDNN_MIN_PRODUCT` multiply-adds go to oneDNN's linear operation, and
    smaller ones to `torch.matmul`; on every backend they must equal
    Keras's products, and under torch a loop whose body holds one must be
    traced, not refused."""
    monkeypatch.setattr(backend_products, "onednn_preferred", lambda: True)
    rng = np.random.default_rng(0)

    def floats(*shape):
        return keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))

    x3, row, small = floats(2, 16, 64), floats(1, 64), floats(5, 16)
    kernel, small_kernel = floats(64, 1024), floats(16, 24)
    embeddings = keras.Variable(rng.normal(size=(32768, 64)).astype("float32"))
    assert 32 * 64 * 1024 >= ONEDNN_MIN_PRODUCT > 64 * 1024

    def products(matmul):
        return [
            matmul(x3, kernel),  # 32 rows
            matmul(keras.ops.reshape(x3, (32, 64)), keras.ops.transpose(embeddings)),  # logits
            matmul(row, keras.ops.transpose(embeddings)),  # one row, 512 times wider than deep
            matmul(row, kernel),  # one row, below the size
            matmul(small, small_kernel),
        ]

    def decoding_matmul(x, kernel):
        return backend_products.matmul(x, kernel, DecodingOptions(direct=True))

    expected = products(keras.ops.matmul)
    got = products(decoding_matmul)
    for g, e in zip(got, expected, strict=True):
        assert keras.backend.standardize_dtype(g.dtype) == "float32"
        assert tuple(g.shape) == tuple(e.shape)
        np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-5, atol=1e-4)
    if keras.backend.backend() != "torch":
        return
    import torch

    from keras_transformer.backend.loops import TracedLoops
    from keras_transformer.backend.loops import while_loop

    with torch.profiler.profile() as profile:
        products(decoding_matmul)
    calls = collections.Counter(event.name for event in profile.events())
    assert calls["mkldnn::_linear_pointwise"] == 3
    assert calls["aten::mm"] == 2

    loops = TracedLoops(keras.layers.Dense(1))

    def run(loops=None):
        return while_loop(
            lambda i, x: keras.ops.less(i, 2),
            lambda i, x: (i + 1, decoding_matmul(x, kernel)[:, :, :64] / 30.0),
            (keras.ops.convert_to_tensor(0), x3),
            loops=loops,
        )

    expected = run()
    with torch.no_grad():
        run(loops)  # eager, the first time
        got = run(loops)  # recorded
    assert (loops.count, loops.refused) == (2, 0)
    np.testing.assert_allclose(to_numpy(got[1]), to_numpy(expected[1]), rtol=1e-5, atol=1e-5)


def test_matrix_product_form_of_einsum_equations():
    assert matrix_product_form("td,dnh->tnh") == 1
    assert matrix_product_form("tnh,nhd->td") == 2
    assert matrix_product_form("abc,cd->abd") == 1
    for equation in ("ab,cb->ac", "ab,bc->ca", "btnh,bsnh->bnts", "a,a->", "...d,dn->...n", "ab,bc,cd->ad", "aab,bc->ac"):
        assert matrix_product_form(equation) is None, equation


def test_the_logits_product_in_float32_is_the_cast_product_or_finer():
    rng = np.random.default_rng(0)
    x = keras.ops.cast(rng.normal(size=(2, 3, 16)), "bfloat16")
    kernel = keras.ops.cast(rng.normal(size=(16, 40)), "bfloat16")
    exact = to_numpy(keras.ops.cast(x, "float32")) @ to_numpy(keras.ops.cast(kernel, "float32"))
    rounded = to_numpy(keras.ops.cast(keras.ops.matmul(x, kernel), "float32"))
    logits = backend_products.float32_matmul(x, kernel)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    logits = to_numpy(logits)
    if keras.backend.backend() == "jax":
        # Accumulated and written in float32: not rounded to bfloat16's 8 bits.
        np.testing.assert_allclose(logits, exact, rtol=1e-5, atol=1e-5)
        assert np.abs(logits - exact).max() < np.abs(rounded - exact).max() / 10
    else:
        np.testing.assert_array_equal(logits, rounded)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's own gradient (custom_vjp); elsewhere the product is the cast product, as the test above checks")
def test_under_jax_the_float32_logits_have_the_cast_product_s_gradients():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 3, 16)), jnp.bfloat16)
    kernel = jnp.asarray(rng.normal(size=(16, 40)), jnp.bfloat16)
    weights = jnp.asarray(rng.normal(size=(2, 3, 40)), jnp.float32)

    def loss(product):
        return lambda x, kernel: jnp.sum(weights * product(x, kernel))

    ours = jax.grad(loss(backend_products.float32_matmul), argnums=(0, 1))(x, kernel)
    cast = jax.grad(loss(lambda x, kernel: jnp.matmul(x, kernel).astype(jnp.float32)), argnums=(0, 1))(x, kernel)
    for mine, theirs in zip(ours, cast):
        assert mine.dtype == jnp.bfloat16 and mine.shape == theirs.shape
        # The same cotangent cast to bfloat16, then the same two products.
        np.testing.assert_array_equal(np.float32(mine), np.float32(theirs))


def compiled_hlo(fn, *inputs):
    """`fn(*inputs)` compiled by XLA: its value and its optimized HLO text
    (None under torch, which runs it eagerly)."""
    if keras.backend.backend() == "torch":
        return fn(*inputs), None
    if keras.backend.backend() == "jax":
        import jax

        jitted = jax.jit(fn)
        return jitted(*inputs), jitted.lower(*inputs).compile().as_text()
    import tensorflow as tf

    compiled = tf.function(fn, jit_compile=True)
    return compiled(*inputs), compiled.experimental_get_compiler_ir(*inputs)(stage="optimized_hlo")


ONE_ROW_PRODUCTS = {
    # name: (our product of x [1, 1, 64] under XLA, Keras's)
    "matmul": (lambda x, k, t, o: backend_products.matmul(x, k, o), lambda x, k, t: keras.ops.matmul(x, k)),
    "einsum into heads": (
        lambda x, k, t, o: backend_products.einsum("btd,dnh->btnh", x, keras.ops.reshape(k, (64, 64, 64)), o),
        lambda x, k, t: keras.ops.einsum("btd,dnh->btnh", x, keras.ops.reshape(k, (64, 64, 64))),
    ),
    "logits": (
        lambda x, k, t, o: backend_products.transposed_matmul(x, t, o),
        lambda x, k, t: keras.ops.matmul(x, keras.ops.transpose(t)),
    ),
}


@pytest.mark.parametrize("form", sorted(ONE_ROW_PRODUCTS))
def test_a_one_row_product_under_xla_equals_keras_and_keeps_the_bias_out_of_it_where_that_is_slow(form):
    """A sentence's greedy step multiplies one row. XLA:CPU fuses a bias
    added to a one-row product into the product and computes the fusion
    with its own loop (`kind=kOutput`), slowly for the logits and, under
    TensorFlow, for a product into heads; ours, under XLA, must give
    Keras's values with no such fusion there. A plain one-row product under
    TensorFlow is left to XLA, whose fusion is as fast there."""
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(rng.normal(size=(1, 1, 64)).astype("float32"))
    kernel = keras.ops.convert_to_tensor(rng.normal(size=(64, 4096)).astype("float32"))
    table = keras.ops.convert_to_tensor(rng.normal(size=(4096, 64)).astype("float32"))
    bias = keras.ops.convert_to_tensor(rng.normal(size=(4096,)).astype("float32"))
    ours, keras_s = ONE_ROW_PRODUCTS[form]
    heads = form == "einsum into heads"
    add_bias = (lambda y, b: y + keras.ops.reshape(b, (64, 64))) if heads else (lambda y, b: y + b)
    options = DecodingOptions(xla=True)
    got, hlo = compiled_hlo(lambda x, k, t, b: add_bias(ours(x, k, t, options), b), x, kernel, table, bias)
    expected, keras_hlo = compiled_hlo(lambda x, k, t, b: add_bias(keras_s(x, k, t), b), x, kernel, table, bias)
    assert tuple(got.shape) == ((1, 1, 64, 64) if heads else (1, 1, 4096))
    np.testing.assert_allclose(to_numpy(got), to_numpy(expected), rtol=1e-4, atol=1e-4)
    if hlo is None:  # torch: the values alone
        return
    tensorflow = keras.backend.backend() == "tensorflow"
    if form == "matmul" and tensorflow:
        assert "kind=kOutput" in hlo  # left to XLA, which fuses it
        return
    assert "kind=kOutput" not in hlo
    if form == "logits" or tensorflow:
        assert "kind=kOutput" in keras_hlo  # what ours avoids (JAX fuses the transposed form only)


@pytest.mark.parametrize("rows", [2, 4, backend_products.COLUMN_LOGITS_MAX_ROWS + 1])
def test_the_logits_of_a_few_rows_under_xla_equal_keras_and_under_jax_multiply_the_table_by_columns(rows):
    """A beam of one sentence has a few rows. Under JAX their logits are
    the table times the rows as columns (XLA:CPU's faster form there), up to
    `COLUMN_LOGITS_MAX_ROWS`; the values are Keras's on every backend."""
    rng = np.random.default_rng(2)
    x = keras.ops.convert_to_tensor(rng.normal(size=(rows, 1, 64)).astype("float32"))
    table = keras.ops.convert_to_tensor(rng.normal(size=(4096, 64)).astype("float32"))
    options = DecodingOptions(xla=keras.backend.backend() != "torch")
    got, hlo = compiled_hlo(lambda x, t: backend_products.transposed_matmul(x, t, options), x, table)
    expected = keras.ops.matmul(x, keras.ops.transpose(table))
    assert tuple(got.shape) == (rows, 1, 4096)
    np.testing.assert_allclose(to_numpy(got), to_numpy(expected), rtol=1e-4, atol=1e-4)
    if keras.backend.backend() == "jax":
        columns = rows <= backend_products.COLUMN_LOGITS_MAX_ROWS
        # The product's shape names its form: table by columns, or rows by table.
        assert (f"f32[4096,{rows}]{{1,0}} dot(" in hlo) == columns, hlo
        assert (f"f32[{rows},4096]{{1,0}} dot(" in hlo) != columns, hlo
