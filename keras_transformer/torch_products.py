"""float32 matrix products under torch on the CPU, through oneDNN where
oneDNN is the faster.

torch multiplies float32 matrices with MKL's `sgemm`. On this project's AMD
CPUs it reaches 100-210 GFLOP/s on two cores, while oneDNN, which torch
ships too and whose linear operation torch's own compiler calls for linear
layers on the CPU, reaches 250-480 on the same products, forward and
backward (benchmarks/README.md). On an Intel CPU, MKL's own maker's, the
order turns. On the Xeon with AMX of benchmarks/README.md
(`benchmarks/torch_cpu_products.py`), `torch.matmul` over oneDNN was
0.92-1.08x on the forward products and input gradients of a training step,
1.08-1.60x on its kernel gradients, 1.05-4.72x on decoding's products of 1
to 8 rows and 0.94-1.71x at 32 to 128. So oneDNN takes the products on
every CPU but an Intel one under a torch built with MKL
(`onednn_preferred`). This is the one module that knows it:

- `install(*layer_classes)` makes the calls of those layers, under torch,
  compute each float32 product of an input and a kernel with oneDNN, with
  its gradients: a `matmul` by a 2-D kernel (Keras's `Dense`, the tied
  output projection) or an `einsum` in matrix-product form, such as the
  attention projections' `td,dnh->tnh` (Keras's `EinsumDense`). Every other
  product, and every product outside those calls, is Keras's own.
- `matrix_product(x, kernel)` is the same product without gradients, for
  decoding (`decoding/compiled.py`).

Products smaller than `ONEDNN_MIN_PRODUCT` multiply-adds stay with torch:
there oneDNN's call costs more than it saves. TensorFlow multiplies with
oneDNN already, and XLA's products under JAX run at 300-430 GFLOP/s.
"""

import functools
import threading

import keras

from keras_transformer import environment

# Below this many multiply-adds, and for one row unless the product is much
# wider than deep (the logits of a single sentence), `torch.matmul` is as
# fast or faster (ad hoc timings of decoding's products, from 1 to 84 rows).
ONEDNN_MIN_PRODUCT = 2**20

_state = threading.local()  # .depth: how many calls of installed layers are running


def onednn_linear():
    """torch's oneDNN linear operation as `linear(x [M, K], weight [N, K])`
    -> `[M, N]`, or None where this build of torch has none. It is compiled
    by TorchScript, so that a tracer records one call: the tracer cannot
    take the operation's empty list of optional scalars itself."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    source = (
        "def linear(x: Tensor, weight: Tensor) -> Tensor:\n"
        "    no_scalars: List[Optional[number]] = []\n"
        '    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", no_scalars, "")\n'
    )
    try:
        return torch.jit.CompilationUnit(source).linear
    except (AttributeError, RuntimeError):
        return None


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
    """Whether oneDNN should compute float x `[M, K]` times kernel `[K, N]`."""
    import torch

    (rows, depth), columns = x.shape, kernel.shape[1]
    return (
        onednn_preferred()
        and _linear() is not None
        and x.dtype == kernel.dtype == torch.float32
        and x.device.type == "cpu"
        and kernel.device.type == "cpu"
        and rows * depth * columns >= ONEDNN_MIN_PRODUCT
        and (rows > 1 or columns >= 8 * depth)
    )


def matrix_product(x, kernel):
    """float x `[M, K]` times kernel `[K, N]`, without gradients: through
    oneDNN where that pays, otherwise `torch.matmul`."""
    import torch

    if pays(x, kernel):
        try:
            return _linear()(x, kernel.t())
        except RuntimeError:
            pass
    return torch.matmul(x, kernel)


@functools.lru_cache(maxsize=64)
def matrix_product_form(equation):
    """For an einsum `equation` of an input and a kernel that is a matrix
    product (the input's trailing axes contracted with the kernel's leading
    ones, such as `td,dnh->tnh` or `tnh,nhd->td`), the number of contracted
    axes; otherwise None."""
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
    return x.reshape(-1, depth), kernel.reshape(depth, -1), shape


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
            linear = _linear()
            x_gradient = kernel_gradient = None
            if ctx.needs_input_grad[0]:
                x_gradient = linear(gradient, kernel)  # [M, N] by [N, K]
            if ctx.needs_input_grad[1]:
                kernel_gradient = linear(x.t(), gradient.t())  # [K, M] by [M, N]
            return x_gradient, kernel_gradient

    return OneDNNProduct


def _product(x, kernel, contracted):
    """Inside an installed layer's call: float x `[..., K...]` times kernel
    `[K..., N...]` through oneDNN, with gradients; None where it does not
    apply or pay."""
    import torch

    # On an accelerator the products stay torch's, before any reshaping.
    if type(x) is not torch.Tensor or not x.is_floating_point() or x.device.type != "cpu":
        return None
    matrices = as_matrices(x, kernel, contracted)
    if matrices is None:
        return None
    x, kernel, shape = matrices
    if not pays(x, kernel):
        return None
    try:
        if torch.is_grad_enabled() and (x.requires_grad or kernel.requires_grad):
            return _product_with_gradients().apply(x, kernel).reshape(shape)
        return _linear()(x, kernel.t()).reshape(shape)
    except RuntimeError:  # shapes or strides this build of oneDNN refuses: Keras's product
        return None



@functools.cache
def _install_products():
    from keras.src.backend.torch import numpy as torch_numpy

    keras_matmul = torch_numpy.matmul
    keras_einsum = torch_numpy.einsum

    def matmul(x1, x2):
        if getattr(_state, "depth", 0) and getattr(x2, "ndim", None) == 2 and getattr(x1, "ndim", 0) >= 2:
            product = _product(x1, x2, 1)
            if product is not None:
                return product
        return keras_matmul(x1, x2)

    def einsum(subscripts, *operands, **kwargs):
        if getattr(_state, "depth", 0) and len(operands) == 2 and not kwargs:
            contracted = matrix_product_form(subscripts)
            if contracted is not None:
                product = _product(operands[0], operands[1], contracted)
                if product is not None:
                    return product
        return keras_einsum(subscripts, *operands, **kwargs)

    environment.replace_in_modules("keras.src.backend", keras_matmul, matmul)
    environment.replace_in_modules("keras.src.backend", keras_einsum, einsum)


def install(*layer_classes):
    """Under torch with oneDNN: the calls of `layer_classes` compute their
    float32 products through oneDNN (see the module's docstring).
    Elsewhere, nothing changes."""
    if keras.backend.backend() != "torch" or _linear() is None:
        return
    _install_products()
    for layer_class in layer_classes:
        call = layer_class.__dict__["call"]
        if not getattr(call, "onednn_products", False):
            layer_class.call = _with_onednn_products(call)


def _with_onednn_products(call):
    """`call`, counted as a call of an installed layer while it runs."""

    @functools.wraps(call)
    def call_with_onednn_products(self, *args, **kwargs):
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            return call(self, *args, **kwargs)
        finally:
            _state.depth -= 1

    call_with_onednn_products.onednn_products = True
    return call_with_onednn_products
