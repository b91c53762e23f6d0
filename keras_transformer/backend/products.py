"""Products of inputs and kernels, per backend.

Our layers multiply their inputs by their kernels through `matmul` and
`einsum` here; under TensorFlow and JAX these are `keras.ops`' own, with
two exceptions for int8 products while decoding (below).

Under torch on the CPU, float32 products go through oneDNN where oneDNN is
the faster. torch multiplies float32 matrices with MKL's `sgemm`, which on
AMD CPUs runs at about half oneDNN's rate; on an Intel CPU with MKL the
order turns, and `torch.matmul` stays (`onednn_preferred`). Products
smaller than `ONEDNN_MIN_PRODUCT` multiply-adds stay with torch, where
oneDNN's call costs more than it saves. While decoding, an einsum in
matrix-product form (`td,dnh->tnh`) is one 2-D product: torch's `einsum`
makes it a batched one.

int8 products of quantized layers while decoding (`int8_product`,
`int8_rows_by_rows`):
- under torch on the CPU, torch's int8 GEMM (`torch._int_mm`), where
  Keras casts to int32 and multiplies with a generic kernel;
- under TensorFlow without XLA, float32 products of the int8 values, exact
  up to 2^24 (TensorFlow's int8 `matmul` is several times slower here);
- under XLA, a single int8 row is multiplied beside a row of zeros: XLA:CPU
  runs one-row int8 products several times slower than two-row ones.
"""


import functools
import math

import keras
from keras import ops

from keras_transformer import environment
from keras_transformer.backend import layouts

# Below this many multiply-adds, and for one row unless the product is much
# wider than deep (the logits of a single sentence), `torch.matmul` is as
# fast or faster (ad hoc timings of decoding's products, from 1 to 84 rows).
ONEDNN_MIN_PRODUCT = 2**20

# A single row times a kernel in torch's order (`backend/layouts.py`) goes
# through oneDNN from this many weights: its call costs about 15 us more
# than `addmm`'s, which it saves from 256 x 512 up (2 cores, AMD EPYC).
ONEDNN_MIN_LINEAR_ROW = 2**17

# Up to this many rows, XLA:CPU computes the logits table `[N, K]` times the
# rows as columns faster than the rows times the transposed table (2 to 12
# rows of a converted OPUS-MT model: 5.5-11.5 against 8.0-12.6 ms).
COLUMN_LOGITS_MAX_ROWS = 12


def onednn_linear():
    """torch's oneDNN linear operation as `linear(x [M, K], weight [N, K],
    bias [N] = None)` -> `[M, N]`, or None where this build of torch has
    none."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    operation = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if operation is None:
        return None

    def linear(x, weight, bias=None):
        return operation(x, weight, bias, "none", [], "")

    return linear


@functools.cache
def _linear():
    return onednn_linear()


@functools.cache
def onednn_preferred():
    """Whether oneDNN multiplies faster than `torch.matmul` on this CPU: on
    every CPU but an Intel one, where torch's MKL is as fast or faster."""
    import torch

    return not (torch.backends.mkl.is_available() and environment.cpu_vendor() == "GenuineIntel")


def pays(x, kernel):
    """Whether oneDNN should compute float x `[M, K]` times kernel `[K, N]`:
    never inside `torch.compile` (`jit_compile=True`), whose Inductor
    cannot lower oneDNN's private operation and lowers torch's own product
    as it sees fit."""
    import torch

    if torch.compiler.is_compiling():
        return False
    (rows, depth), columns = x.shape, kernel.shape[1]
    if not (
        onednn_preferred()
        and _linear() is not None
        and x.dtype == kernel.dtype == torch.float32
        and x.device.type == "cpu"
        and kernel.device.type == "cpu"
    ):
        return False
    if rows == 1 and depth * columns >= ONEDNN_MIN_LINEAR_ROW and layouts.in_linear_order(kernel):
        return True
    return rows * depth * columns >= ONEDNN_MIN_PRODUCT and (rows > 1 or columns >= 8 * depth)


def matrix_product(x, kernel, bias=None):
    """float x `[M, K]` times kernel `[K, N]`, plus `bias` `[N]` if given,
    without gradients: through oneDNN where that pays, otherwise torch's
    `matmul`, or its `linear`, which adds the bias inside the product."""
    import torch

    if pays(x, kernel):
        try:
            return _linear()(x, kernel.t(), bias)
        except RuntimeError:
            pass
    return torch.matmul(x, kernel) if bias is None else torch.nn.functional.linear(x, kernel.t(), bias)


def matrix_product_form(equation):
    """For an einsum `equation` of an input and a kernel that is a matrix
    product (the input's trailing axes contracted with the kernel's leading
    ones, such as `td,dnh->tnh` or `tnh,nhd->td`), the number of contracted
    axes; otherwise None."""
    # A dict, not `functools.lru_cache`, which `torch.compile` warns of.
    if equation not in _MATRIX_PRODUCT_FORMS:
        _MATRIX_PRODUCT_FORMS[equation] = _matrix_product_form(equation)
    return _MATRIX_PRODUCT_FORMS[equation]


_MATRIX_PRODUCT_FORMS = {}


def _matrix_product_form(equation):
    inputs, _, output = equation.replace(" ", "").partition("->")
    operands = inputs.split(",")
    if len(operands) != 2 or "." in equation or not output:
        return None
    lhs, rhs = operands
    letters = lhs + rhs
    if len(set(lhs)) != len(lhs) or len(set(rhs)) != len(rhs) or len(set(output)) != len(output):
        return None
    contracted = len(set(lhs) & set(rhs))
    if (
        contracted == 0
        or lhs[len(lhs) - contracted :] != rhs[:contracted]
        or output != lhs[: len(lhs) - contracted] + rhs[contracted:]
        or not set(output) <= set(letters)
    ):
        return None
    return contracted


def as_matrices(x, kernel, contracted):
    """x `[..., K...]` and kernel `[K..., N...]` of x's dtype as `[M, K]`
    and `[K, N]`, and the product's shape; or None."""
    import torch

    if isinstance(kernel, keras.Variable):  # Keras's layers pass their kernel
        kernel = kernel.value
    if not (
        isinstance(kernel, torch.Tensor)  # a Parameter, for a kernel
        and kernel.dtype == x.dtype
        and x.device == kernel.device
        and x.ndim > contracted
        and kernel.ndim > contracted
        and x.shape[x.ndim - contracted :] == kernel.shape[:contracted]
    ):
        return None
    depth = kernel.shape[:contracted].numel()
    shape = x.shape[: x.ndim - contracted] + kernel.shape[contracted:]
    rows = x if x.ndim == 2 and contracted == 1 else x.reshape(-1, depth)
    matrix = kernel if kernel.ndim == 2 and contracted == 1 else kernel.reshape(depth, -1)
    return rows, matrix, shape


def _shaped(product, shape):
    """`product` as `shape`: a torch view only where the shapes differ
    (each view is one more operation, forward and backward, for the host)."""
    return product if product.shape == shape else product.reshape(shape)


@functools.cache
def _product_with_gradients():
    """The autograd function of x `[M, K]` times kernel `[K, N]` through
    oneDNN: y = x W, dL/dx = dL/dy W^T, dL/dW = x^T dL/dy, each one oneDNN
    linear operation (`linear(a, b)` is a b^T)."""
    import torch

    class OneDNNProduct(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, kernel):
            ctx.save_for_backward(x, kernel)
            return _linear()(x, kernel.t())

        @staticmethod
        def backward(ctx, gradient):
            x, kernel = ctx.saved_tensors
            # Applied where `torch.compile` broke its graph, the backward may
            # still be traced, and Inductor cannot lower oneDNN's operation.
            linear = (lambda a, b: torch.matmul(a, b.t())) if torch.compiler.is_compiling() else _linear()
            x_gradient = kernel_gradient = None
            if ctx.needs_input_grad[0]:
                x_gradient = linear(gradient, kernel)  # [M, N] by [N, K]
            if ctx.needs_input_grad[1]:
                kernel_gradient = linear(x.t(), gradient.t())  # [K, M] by [M, N]
            return x_gradient, kernel_gradient

    return OneDNNProduct


def _product(x, kernel, contracted):
    """In a layer's call, outside decoding: float x `[..., K...]` times kernel
    `[K..., N...]` through oneDNN, with gradients; None where it does not
    apply or pay."""
    import torch

    if type(x) is not torch.Tensor or not x.is_floating_point():
        return None
    matrices = as_matrices(x, kernel, contracted)
    if matrices is None:
        return None
    x, kernel, shape = matrices
    if not pays(x, kernel):
        # One 2-D product: Keras's einsum costs the host several torch
        # operations and its dtype rules, on a GPU longer than the product.
        return _shaped(torch.matmul(x, kernel), shape)
    try:
        if torch.is_grad_enabled() and (x.requires_grad or kernel.requires_grad):
            return _shaped(_product_with_gradients().apply(x, kernel), shape)
        return _shaped(_linear()(x, kernel.t()), shape)
    except RuntimeError:  # shapes or strides this build of oneDNN refuses: Keras's product
        return None


def _torch_tensor(x):
    import torch

    return type(x) is torch.Tensor


def _kernel_value(kernel):
    return kernel.value if isinstance(kernel, keras.Variable) else kernel


def _one_row_under_tensorflow_xla(x, kernel, contracted, decoding):
    """x of one row `[1.., K...]` times kernel `[K..., N...]`, beside a row of
    zeros, under TensorFlow's XLA; None elsewhere.

    TensorFlow's XLA makes a one-row product a matrix-vector product, fuses
    the bias added after it into it, and computes the fusion with its own
    loop instead of its library's: a greedy step of a sentence ran 3x
    slower. A two-row product is not fused. The fusion is slow where the
    product is split into heads (the attention's projections in, of a
    kernel `[K, heads, N]`) and for the logits; elsewhere (the feed-forward
    layers, the attention's projection out) it is as fast as the paired
    product or faster, so those are left to XLA (greedy on one sentence of
    an OPUS-MT-size model: 0.51 against 0.53 s paired everywhere).
    """
    if decoding is None or not decoding.xla or keras.backend.backend() != "tensorflow":
        return None
    return _one_row_paired(x, kernel, contracted)


def _one_row_paired(x, kernel, contracted):
    """x `[1.., K...]`, of one row known when traced, times kernel `[K...,
    N...]`, as the first row of the product of that row and a row of zeros;
    None for any other x."""
    leading = tuple(x.shape[: len(x.shape) - contracted])
    if None in leading or math.prod(leading) != 1 or None in tuple(kernel.shape):
        return None
    depth = math.prod(kernel.shape[:contracted])
    matrix = ops.reshape(kernel, (depth, -1))
    product = _paired(ops.reshape(x, (1, depth)), lambda rows: ops.matmul(rows, matrix))
    return ops.reshape(product, leading + tuple(kernel.shape[contracted:]))


def matmul(x, kernel, decoding=None):
    """x `[..., K]` times kernel `[K, N]` (a layer's input and kernel);
    `decoding`, the `DecodingOptions` of a decoding call, or None."""
    if keras.backend.backend() == "torch" and _torch_tensor(x) and x.is_floating_point() and x.ndim >= 2:
        kernel = _kernel_value(kernel)
        if decoding is not None:
            matrices = as_matrices(x, kernel, 1)
            if matrices is not None:
                rows, matrix, shape = matrices
                return _shaped(matrix_product(rows, matrix), shape)
        else:
            product = _product(x, kernel, 1)
            if product is not None:
                return product
    return ops.matmul(x, kernel)


def float32_matmul(x, kernel, decoding=None):
    """x `[..., K]` times kernel `[K, N]`, in float32 whatever their dtype.

    Under JAX a 16-bit product is accumulated and written in float32
    (`preferred_element_type`), where a product in their dtype and a cast
    round it to 16 bits and pass over the `[..., N]` result again: for the
    logits, the largest tensor of a step. Its gradient is the same as the
    cast product's: the cotangent cast to the inputs' dtype, then the two
    products in it. Elsewhere the product, then the cast.
    """
    if keras.backend.backend() == "jax" and ops.dtype(x) != "float32" and ops.dtype(x) == ops.dtype(kernel):
        return _jax_float32_matmul()(x, kernel)
    return ops.cast(matmul(x, kernel, decoding), "float32")


@functools.cache
def _jax_float32_matmul():
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def product(x, kernel):
        return jnp.matmul(x, kernel, preferred_element_type=jnp.float32)

    def forward(x, kernel):
        return product(x, kernel), (x, kernel)

    def backward(residuals, cotangent):
        x, kernel = residuals
        cotangent = cotangent.astype(x.dtype)
        rows = cotangent.reshape(-1, cotangent.shape[-1])
        x_gradient = jnp.matmul(cotangent, kernel.T)
        kernel_gradient = jnp.matmul(x.reshape(-1, x.shape[-1]).T, rows)
        return x_gradient, kernel_gradient

    product.defvjp(forward, backward)
    return product


def transposed_matmul(x, table, decoding=None):
    """x `[..., K]` times `table` `[N, K]` transposed (the logits of states
    by the token embedding), in float32 whatever their dtype.

    Under XLA, XLA:CPU fuses a bias added to a one-row product into the
    product, which it then computes with its own loop, ten times slower
    than its library's (the logits of one sentence, greedy: 60 against 5 ms
    at 58,101 ids). So one float32 row's product is kept whole: under JAX
    behind an optimization barrier, under TensorFlow's XLA (which has no
    public barrier) beside a row of zeros. Under JAX, a few rows (a beam of
    one sentence) are multiplied as columns by the table, also behind the
    barrier.
    """
    leading = tuple(x.shape[:-1])
    rows = None if None in leading else math.prod(leading)
    xla_float32 = (
        decoding is not None and decoding.xla and rows is not None and ops.dtype(x) == ops.dtype(table) == "float32"
    )
    if xla_float32 and keras.backend.backend() == "jax" and rows <= COLUMN_LOGITS_MAX_ROWS:
        import jax

        if rows == 1:
            return jax.lax.optimization_barrier(ops.matmul(x, ops.transpose(table)))
        columns = ops.transpose(ops.reshape(x, (rows, -1)))
        product = jax.lax.optimization_barrier(ops.matmul(table, columns))
        return ops.reshape(ops.transpose(product), leading + (table.shape[0],))
    if xla_float32 and rows == 1:
        one_row = _one_row_under_tensorflow_xla(x, ops.transpose(table), 1, decoding)
        if one_row is not None:
            return one_row
    return float32_matmul(x, ops.transpose(table), decoding)


def einsum(equation, x, kernel, decoding=None):
    """`keras.ops.einsum(equation, x, kernel)` of a layer's input and kernel."""
    contracted = matrix_product_form(equation)
    if contracted and len(kernel.shape) - contracted > 1:  # into heads
        one_row = _one_row_under_tensorflow_xla(x, kernel, contracted, decoding)
        if one_row is not None:
            return one_row
    if keras.backend.backend() == "torch" and _torch_tensor(x) and x.is_floating_point():
        if contracted is not None:
            kernel = _kernel_value(kernel)
            if decoding is not None:
                matrices = as_matrices(x, kernel, contracted)
                if matrices is not None:
                    rows, matrix, shape = matrices
                    return _shaped(matrix_product(rows, matrix), shape)
            else:
                product = _product(x, kernel, contracted)
                if product is not None:
                    return product
    return ops.einsum(equation, x, kernel)


def biased_product(x, kernel, bias, contracted=1, decoding=None):
    """Under torch: float x `[..., K...]` times kernel `[K..., N...]` plus
    `bias` `[N...]`, as one operation whose product adds the bias (`addmm`;
    while decoding, `matrix_product`): on a GPU one kernel fewer, where a
    torch step is bound by the host's launches. None elsewhere, and where
    oneDNN takes a product with gradients; the caller then adds the bias
    to `matmul`'s or `einsum`'s product."""
    if not (bias is not None and keras.backend.backend() == "torch" and _torch_tensor(x) and x.is_floating_point()):
        return None
    import torch

    kernel, bias = _kernel_value(kernel), _kernel_value(bias)
    matrices = as_matrices(x, kernel, contracted)
    if (
        matrices is None
        or not isinstance(bias, torch.Tensor)
        or bias.dtype != x.dtype
        or bias.device != x.device
        or bias.shape != kernel.shape[contracted:]
    ):
        return None
    rows, matrix, shape = matrices
    bias = bias if bias.ndim == 1 else bias.reshape(-1)
    if decoding is not None:
        return _shaped(matrix_product(rows, matrix, bias), shape)
    if pays(rows, matrix):
        return None  # oneDNN's product with gradients (`_product`) takes no bias
    return _shaped(torch.addmm(bias, rows, matrix), shape)


def int8_product(x, kernel, contracted, decoding=None):
    """int8 x `[..., K...]` times int8 kernel `[K..., N...]` (its last
    `contracted` axes against the kernel's first), as int32 sums."""
    kernel = _kernel_value(kernel)
    leading = tuple(ops.shape(x)[: len(x.shape) - contracted])  # tensors where unknown
    depth_shape = tuple(kernel.shape[:contracted])
    output_shape = tuple(kernel.shape[contracted:])
    if keras.backend.backend() == "torch" and _torch_tensor(x) and x.device.type == "cpu":
        matrices = as_matrices(x, kernel, contracted)
        if matrices is not None:
            import torch

            rows, matrix, shape = matrices
            try:
                return torch._int_mm(rows, matrix).reshape(shape)
            except RuntimeError:  # shapes torch's int8 GEMM refuses
                pass
    depth = math.prod(depth_shape)
    float_int8 = decoding is not None and decoding.float_int8
    xla = decoding is not None and decoding.xla
    if float_int8:
        rows = ops.reshape(ops.cast(x, "float32"), (-1, depth))
        matrix = ops.reshape(ops.cast(kernel, "float32"), (depth, -1))
        return ops.reshape(ops.cast(ops.matmul(rows, matrix), "int32"), leading + output_shape)
    one_row = _one_row_paired(x, kernel, contracted) if xla else None
    if one_row is not None:
        return one_row
    if contracted == 1 and len(kernel.shape) == 2:
        return ops.matmul(x, kernel)
    rows = ops.reshape(x, (-1, depth))
    return ops.reshape(ops.matmul(rows, ops.reshape(kernel, (depth, -1))), leading + output_shape)


def int8_rows_by_rows(x, table, decoding=None):
    """int8 rows x `[M, K]` times the int8 rows of `table` `[N, K]`
    (`td,vd->tv`: our int8 embedding's logits), as int32 sums."""
    table = _kernel_value(table)
    backend = keras.backend.backend()
    if backend == "torch" and _torch_tensor(x) and x.device.type == "cpu":
        import torch

        try:
            return torch._int_mm(x, table.t())
        except RuntimeError:
            pass
    if decoding is not None and decoding.float_int8:
        return ops.cast(ops.matmul(ops.cast(x, "float32"), ops.transpose(ops.cast(table, "float32"))), "int32")
    if decoding is None or not decoding.xla:
        return ops.einsum("td,vd->tv", x, table)
    if backend == "tensorflow":
        # As M one-row products by the transposed table, as Keras's `matmul`
        # of `[M, 1, K]` computes them: TensorFlow's XLA ran this form
        # fastest.
        def rows_by_rows(rows):
            return ops.matmul(rows[:, None, :], ops.transpose(table))[:, 0, :]
    else:
        def rows_by_rows(rows):
            return ops.einsum("td,vd->tv", rows, table)
    if x.shape[0] == 1:
        return _paired(x, rows_by_rows)
    return rows_by_rows(x)


def int8_rescaled(sums, rows_scale, columns_scale, dtype, decoding=None):
    """int32 `sums` as `dtype`, divided by the scale of their row (`[..., 1]`)
    and of their column (`[N]`), as Keras's int8 layers divide them. Under
    torch's direct calls in float32, one tensor is made, not three: a beam's
    logits are 30 MB a step, and each new tensor of that size is memory
    the system must map again."""
    if decoding is not None and decoding.direct and dtype == "float32" and _torch_tensor(sums):
        import torch

        return torch.div(sums, _kernel_value(columns_scale)).div_(rows_scale)
    return ops.divide(ops.cast(sums, dtype), ops.multiply(rows_scale, columns_scale))


def _paired(row, product):
    """`product(rows)` of `row` `[1, K]` and a row of zeros, and its first row."""
    return product(ops.concatenate([row, ops.zeros_like(row)], axis=0))[:1]
