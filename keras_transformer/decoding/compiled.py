"""Decoding functions compiled once per input shape, on each backend.

This is the one module of `decoding/` that knows the backend. Under
TensorFlow a function becomes a `tf.function` whose input signature leaves
every dimension open, so it is traced once for all shapes; with XLA, which
compiles each shape anyway, it is traced once per shape. Under JAX it
becomes a `jax.jit` function of the model's weights and its inputs, so it is
compiled once per input shape and the weights are not baked in as
constants. Under torch it runs eagerly, without autograd, and calls the
model's layers directly (see `_direct_layer_calls`); the body of each
`while_loop` in it is traced once per shapes and replayed (see
`_TracedLoops`).
"""

import collections
import contextlib
import functools
import importlib
import math
import threading
import types
import warnings

import keras
import numpy as np

from keras_transformer import environment
from keras_transformer import torch_products


class CompiledFunction:
    """`fn(*inputs)` of a model, compiled for the current backend.

    Args:
        fn: a function of int32 tensors that calls `model`'s layers and
            returns a nest of tensors.
        model: the model whose weights `fn` reads.
        input_ranks: the rank of each input, for TensorFlow's shape-generic
            signature (without XLA).
        jit_compile: compile with XLA under TensorFlow (JAX always does).
        direct_layer_calls: under torch, call built layers' `call` without
            `Layer.__call__` when no layer of `model` autocasts (see
            `_direct_layer_calls`). The benchmarks turn it off to time
            keras-hub's layers as keras-hub runs them.
        trace_loops: under torch, with direct layer calls, trace the
            condition and body of each `while_loop` in `fn` once per shapes
            and replay the traces (see `_TracedLoops`).

    Call it with NumPy arrays; it returns NumPy arrays. `traces` counts how
    often `fn` was traced: once per call under torch, which runs eagerly.
    `loops` is the `_TracedLoops` of a torch function whose loops are
    traced, else None.
    """

    def __init__(self, fn, model, input_ranks, jit_compile=False, direct_layer_calls=True, trace_loops=True):
        self.fn = fn
        self.model = model
        self.traces = 0
        self.loops = None
        backend = keras.backend.backend()
        self._xla = backend == "jax" or (backend == "tensorflow" and jit_compile)
        if backend == "tensorflow":
            import tensorflow as tf

            if jit_compile:
                _install_paired_int8_rows("tensorflow")
                # XLA compiles every input shape anyway. Traced once per
                # shape, the function sees static shapes, and the search's
                # caches can grow in phases (`while_in_phases`).
                self._call = tf.function(self._traced, jit_compile=True, reduce_retracing=False)
            else:
                signature = [tf.TensorSpec([None] * rank, tf.int32) for rank in input_ranks]
                _install_float_int8_products()

                def traced(*inputs):
                    with _float_int8_products():
                        return self._traced(*inputs)

                self._call = tf.function(traced, input_signature=signature)
        elif backend == "jax":
            import jax

            _install_paired_int8_rows("jax")

            def stateless(values, *inputs):
                mapping = list(zip(model.variables, values))
                with keras.StatelessScope(state_mapping=mapping):
                    return self._traced(*inputs)

            jitted = jax.jit(stateless)
            self._call = lambda *inputs: jitted([v.value for v in model.variables], *inputs)
        elif backend == "torch":
            import torch

            direct = direct_layer_calls and _has_one_dtype(model)
            loops = self.loops = _TracedLoops(model) if direct and trace_loops else None

            def eager(*inputs):
                with torch.no_grad(), _direct_layer_calls(direct, loops):
                    return self._traced(*inputs)

            self._call = eager
        else:
            raise ValueError(
                "Decoding runs under the tensorflow, jax and torch backends. "
                f"Received: KERAS_BACKEND={backend!r}"
            )

    def _traced(self, *inputs):
        self.traces += 1
        outer = _calling.xla
        _calling.xla = self._xla
        try:
            return self.fn(*inputs)
        finally:
            _calling.xla = outer

    def __call__(self, *inputs):
        inputs = [keras.ops.convert_to_tensor(np.asarray(x, "int32")) for x in inputs]
        outputs = self._call(*inputs)
        return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


# Under torch nothing compiles the search: every step runs the model's
# layers from Python. There `Layer.__call__`, which binds the arguments,
# converts them, walks their nests for masks, resolves `training` and opens
# name and dtype scopes, costs more than the arithmetic of a decoding step:
# a greedy step of the small model at batch 1 took 6.8 ms through it and
# 3.4 ms calling each built layer's `call` (benchmarks/README.md). A
# decoding call needs none of that work when every layer computes in its
# variables' dtype (no autocasting), passes `training=False` or leaves it
# None (inference either way), and passes its masks explicitly, as ours do.
#
# The next cost was each operation's test for symbolic (Keras) tensors
# among its arguments, which walks every argument that is not itself a
# Keras tensor with torch's pytree functions: a third of the Python time of
# that step. While decoding directly, the test looks through lists, tuples
# and dicts only, which are the nests a decoding step passes.
#
# Then the cache writes: Keras's torch `slice_update` at a tensor position
# (the step index is a tensor in the search loop) builds a grid of indices
# over the whole update and scatters it with `index_put_`. While decoding
# directly, it copies the cache and writes the update into a narrowed view
# of the copy: the same result, as a copy and a block write.
#
# Then what every operation pays on its way to torch (benchmarks/README.md,
# torch decoding at base, batch 32: a third of the search was Python and
# torch's dispatch, not arithmetic). While decoding directly:
# - `dot_product_attention` hands the heads-second views of the queries,
#   keys and values to torch's `scaled_dot_product_attention` as they are.
#   Keras's copies each into a contiguous tensor first. (This was every
#   layer's whole self-attention cache at every step; since the cache is
#   heads-major, this serves the encoder's attention.)
# - Attention over a heads-major cache, which `MultiHeadAttention` writes
#   out for every backend, is torch's `scaled_dot_product_attention`, which
#   takes queries, keys and values with the heads second, as the cache
#   holds them.
# - `convert_to_tensor` returns a torch tensor as it is (cast if a dtype is
#   asked for). Keras's also checks it against Keras's device, and calls
#   `.to` even when the dtype is already right; inside a decoding call
#   every tensor comes from the model's weights and inputs, which are on
#   that device already.
# - `standardize_dtype` and `to_torch_dtype` remember their answers: each
#   operation calls them several times, always with the same few dtypes.
# - An `einsum` of an input and a kernel in matrix-product form (each
#   attention projection's `td,dnh->tnh`) is one 2-D product: torch's
#   `einsum` makes it a batched product, about 1.7x slower on the
#   projections of a batch of 32.
# - A float32 product of an input and a kernel goes to oneDNN where that
#   pays (`torch_products.matrix_product`): on an AMD machine at batch 32
#   the base model's beam search took 1.9-2.0 s per batch against 3.1-3.3
#   through `torch.matmul` (benchmarks/README.md). On an Intel CPU torch's
#   own product is the faster, and the products stay `torch.matmul`.
# - An int8 by int8 `matmul` or `einsum` (Keras's int8 `Dense` and
#   `EinsumDense`) on the CPU is one `torch._int_mm`, an int8 GEMM with
#   int32 sums. Keras uses it on CUDA only; on the CPU it casts both to
#   int32 and multiplies them with torch's generic kernel, several times
#   slower than a float32 product of the same shape. The sums are exact
#   integers either way, so the results are the same.
# - The int8 layers' quantization of their inputs (scale by the absolute
#   maximum, round, clip, cast) is the same arithmetic in torch's own
#   operations, without a Keras operation's overhead around each of nine.
# - A function with a custom gradient (each int8 layer's product is one)
#   is called as it is: no gradient is taken while decoding, and Keras's
#   torch `custom_gradient` wraps every call in a `torch.autograd.Function`.
#
# Last, the loops. With all of the above, a greedy step of the small model
# at batch 1 still ran about 190 Keras operations from Python, each a few
# microseconds of Keras and torch dispatch around a kernel of about as long.
# While decoding directly, `while_loop` traces its condition and body with
# `torch.jit.trace` the first time it meets them with given shapes, and
# replays the traces at every step and in later calls: the same torch
# operations, without Python between them (`_TracedLoops`).

class _Calling(threading.local):
    """Per thread: whether a decoding call runs its layers directly, the
    traces of its loops, whether int8 products are computed in float32
    (TensorFlow without XLA), and whether the function being traced is
    compiled by XLA."""

    direct = False
    loops = None
    float_int8 = False
    xla = False


_calling = _Calling()


def compiled_by_xla():
    """Whether the function a `CompiledFunction` is tracing now will be
    compiled by XLA (under JAX, or TensorFlow with `jit_compile`)."""
    return _calling.xla


def _has_one_dtype(model):
    """Whether no layer of `model` autocasts: mixed precision policies need
    `Layer.__call__`'s dtype scope."""
    return all(
        layer.compute_dtype == layer.variable_dtype
        for layer in model._flatten_layers(include_self=True)
    )


@contextlib.contextmanager
def _direct_layer_calls(active=True, loops=None):
    """Within this block, on this thread, calling a built layer runs its
    `call` (`quantized_call` if quantized) without `Layer.__call__`. Layers
    not yet built, or under rematerialization, go the usual way. With
    `loops` (a `_TracedLoops`), `while_loop` replays traced bodies."""
    _install_direct_calls()
    outer = _calling.direct, _calling.loops
    _calling.direct, _calling.loops = active, loops if active else None
    try:
        yield
    finally:
        _calling.direct, _calling.loops = outer


def _install_direct_calls():
    layer_class = keras.layers.Layer
    keras_call = layer_class.__call__
    if getattr(keras_call, "direct_when_decoding", False):
        return

    def __call__(self, *args, **kwargs):
        if self.built and not self._remat_mode and _calling.direct:
            # What `Operation.__call__` runs, with no Keras tensors about.
            if getattr(self, "quantization_mode", None) is not None:
                return self.quantized_call(*args, **kwargs)
            return self.call(*args, **kwargs)
        return keras_call(self, *args, **kwargs)

    __call__.direct_when_decoding = True
    layer_class.__call__ = __call__
    _install_plain_symbolic_tests()
    if keras.backend.backend() == "torch":
        _install_block_slice_updates()
        _install_attention_on_views()
        _install_fused_cache_attention()
        _install_tensor_passthrough()
        _install_dtype_memos()
        _install_matrix_products()
        _install_torch_input_quantizer()
        _install_plain_custom_gradients()
        _install_traced_loops()


def _holds_keras_tensor(value):
    kind = type(value)
    if kind is tuple or kind is list or kind is dict:
        for item in value.values() if kind is dict else value:
            if _holds_keras_tensor(item):
                return True
        return False
    return isinstance(value, keras.KerasTensor)


def _install_plain_symbolic_tests():
    """Replaces `any_symbolic_tensors` in the modules of Keras operations
    (and its quantizers) by a test that, while decoding directly, looks
    through lists, tuples and dicts only; otherwise it is Keras's own."""
    from keras.src.backend.common import keras_tensor

    keras_test = keras_tensor.any_symbolic_tensors

    def any_symbolic_tensors(args=None, kwargs=None):
        if _calling.direct:
            return _holds_keras_tensor(args) or _holds_keras_tensor(kwargs)
        return keras_test(args, kwargs)

    environment.replace_in_modules(("keras.src.ops.", "keras.src.quantizers."), keras_test, any_symbolic_tensors)


def _install_block_slice_updates():
    """Replaces torch's `slice_update` by one that, while decoding directly,
    copies `inputs` and writes `updates` into a narrowed view of the copy;
    otherwise, or for starts other than ints and 0-d integer tensors, it is
    Keras's own."""
    import torch
    from keras.src.backend.torch import core

    keras_update = core.slice_update

    def is_start(start):
        if isinstance(start, int):
            return True
        return isinstance(start, torch.Tensor) and start.ndim == 0 and not start.is_floating_point()

    def slice_update(inputs, start_indices, updates):
        if (
            _calling.direct
            and isinstance(inputs, torch.Tensor)
            and isinstance(updates, torch.Tensor)
            and isinstance(start_indices, (list, tuple))
            and len(start_indices) == inputs.ndim == updates.ndim
            and all(is_start(start) for start in start_indices)
        ):
            outputs = inputs.clone()
            block = outputs
            for dim, (start, length) in enumerate(zip(start_indices, updates.shape)):
                block = block.narrow(dim, start, length)
            block.copy_(updates)
            return outputs
        return keras_update(inputs, start_indices, updates)

    environment.replace_in_modules("keras.src.backend", keras_update, slice_update)


_large_negatives = {}


def _fused_attention(query, key, value, mask, scale):
    """torch's `scaled_dot_product_attention` of `[B, N, T, H]` queries and
    `[B, N, S, H]` keys and values, with a boolean mask (True: attend) made
    additive with Keras's stand-in for -inf in `query`'s dtype, made once
    per dtype and device."""
    import torch
    from keras.src.backend.torch import nn as torch_nn

    if mask is not None:
        negative_key = (query.dtype, query.device)
        if negative_key not in _large_negatives:
            _large_negatives[negative_key] = torch_nn._get_large_negative(query.dtype).to(query.device)
        mask = torch.where(mask, 0.0, _large_negatives[negative_key])
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale
    )


def _install_attention_on_views():
    """Replaces torch's `dot_product_attention` by one that, while decoding
    directly, gives torch's `scaled_dot_product_attention` the transposed
    views of its inputs instead of contiguous copies; otherwise, or with a
    bias, a causal flag, a soft cap, a flash-attention choice, grouped heads,
    mixed dtypes or a mask that is not boolean, it is Keras's own."""
    import torch
    from keras.src.backend.torch import nn as torch_nn

    keras_attention = torch_nn.dot_product_attention
    def fits(query, key, value, mask):
        return (
            all(type(tensor) is torch.Tensor and tensor.ndim == 4 for tensor in (query, key, value))
            and query.shape[2] == key.shape[2] == value.shape[2]  # no grouped heads
            and query.dtype == key.dtype == value.dtype
            and (mask is None or (type(mask) is torch.Tensor and mask.dtype == torch.bool))
        )

    def dot_product_attention(
        query,
        key,
        value,
        bias=None,
        mask=None,
        scale=None,
        is_causal=False,
        flash_attention=None,
        attn_logits_soft_cap=None,
    ):
        if (
            _calling.direct
            and bias is None
            and not is_causal
            and flash_attention is None
            and attn_logits_soft_cap is None
            and fits(query, key, value, mask)
        ):
            attended = _fused_attention(
                query.transpose(1, 2),  # [B, N, T, H] views of [B, T, N, H]
                key.transpose(1, 2),
                value.transpose(1, 2),
                mask,
                scale,
            )
            return attended.transpose(1, 2)
        return keras_attention(
            query,
            key,
            value,
            bias=bias,
            mask=mask,
            scale=scale,
            is_causal=is_causal,
            flash_attention=flash_attention,
            attn_logits_soft_cap=attn_logits_soft_cap,
        )

    environment.replace_in_modules("keras.src.backend", keras_attention, dot_product_attention)


def _install_fused_cache_attention():
    """Replaces `MultiHeadAttention._attend_to_cache` by one that, while
    decoding directly, hands float32 queries and a float32 `[B, N, S, H]`
    cache to torch's `scaled_dot_product_attention`; otherwise it is the
    written-out softmax of `MultiHeadAttention`."""
    import torch

    from keras_transformer.layers.multi_head_attention import MultiHeadAttention

    written_out = MultiHeadAttention._attend_to_cache

    def attend_to_cache(self, query, key, value, mask):
        if (
            _calling.direct
            and all(type(tensor) is torch.Tensor for tensor in (query, key, value))
            and query.dtype == key.dtype == value.dtype == torch.float32
            and (mask is None or (type(mask) is torch.Tensor and mask.dtype == torch.bool))
        ):
            attended = _fused_attention(
                query.transpose(1, 2),  # [B, N, T, H]
                key,
                value,
                None if mask is None else mask[:, None],  # [B or 1, 1, T, S]
                self._inverse_sqrt_key_dim,
            )
            return attended.transpose(1, 2)  # [B, T, N, H]
        return written_out(self, query, key, value, mask)

    MultiHeadAttention._attend_to_cache = attend_to_cache


def _install_tensor_passthrough():
    """Replaces torch's `convert_to_tensor` in Keras's backend modules by
    one that, while decoding directly, returns a torch tensor as it is, or
    cast to the dtype asked for; otherwise it is Keras's own."""
    import torch
    from keras.src.backend.torch import core

    keras_convert = core.convert_to_tensor

    def convert_to_tensor(x, dtype=None, sparse=None, ragged=None):
        if _calling.direct and type(x) is torch.Tensor and not sparse and not ragged:
            if dtype is None:
                return x
            dtype = core.to_torch_dtype(dtype)
            return x if x.dtype == dtype else x.to(dtype)
        return keras_convert(x, dtype=dtype, sparse=sparse, ragged=ragged)

    environment.replace_in_modules("keras.src.backend", keras_convert, convert_to_tensor)


def _remembered(function):
    """`function` of a dtype, remembering its answers while decoding
    directly (for dtypes that can be dict keys; not None, which means the
    float type of the moment)."""
    answers = {}

    def remembering(dtype):
        if not _calling.direct or dtype is None:
            return function(dtype)
        try:
            return answers[dtype]
        except KeyError:
            answer = answers[dtype] = function(dtype)
            return answer
        except TypeError:  # not hashable
            return function(dtype)

    return remembering


def _install_dtype_memos():
    """`standardize_dtype` and torch's `to_torch_dtype`, remembering."""
    from keras.src.backend.common import variables
    from keras.src.backend.torch import core

    for original in (variables.standardize_dtype, core.to_torch_dtype):
        environment.replace_in_modules("keras.src", original, _remembered(original))


@functools.lru_cache(maxsize=64)
def _rows_by_rows_form(equation):
    """Whether an einsum `equation` multiplies the rows of a matrix by the
    rows of another, `td,vd->tv` (x times kernel transposed): our int8
    embedding's logits."""
    inputs, _, output = equation.replace(" ", "").partition("->")
    operands = inputs.split(",")
    if len(operands) != 2 or any(len(operand) != 2 for operand in operands):
        return False
    (t, d), (v, e) = operands
    return d == e and len({t, d, v}) == 3 and output == t + v


def _install_matrix_products():
    """Replaces torch's `matmul` and `einsum` by ones that, while decoding
    directly, compute an `einsum` of an input and a kernel in
    matrix-product form as one 2-D product (for floats,
    `torch_products.matrix_product`: oneDNN where that pays), and
    on the CPU multiply int8 by int8 (`matmul` or `einsum`) with
    `torch._int_mm`; otherwise, or if torch refuses the shapes, they are
    Keras's own."""
    import torch
    from keras.src.backend.torch import numpy as torch_numpy

    keras_matmul = torch_numpy.matmul
    keras_einsum = torch_numpy.einsum

    def int8_input(x):
        """Whether `x` is an int8 torch tensor met while decoding directly:
        checked first, so that float products pay nothing more."""
        return _calling.direct and type(x) is torch.Tensor and x.dtype == torch.int8

    def int8_product(x, kernel, contracted):
        """int8 x `[..., K...]` times kernel `[K..., N...]` in int32, or None."""
        matrices = torch_products.as_matrices(x, kernel, contracted)
        if matrices is None or x.device.type != "cpu":
            return None
        x, kernel, shape = matrices
        try:
            sums = torch._int_mm(x, kernel)
        except RuntimeError:
            return None
        return sums.reshape(shape)

    def float_product(x, kernel, contracted):
        """float x `[..., K...]` times kernel `[K..., N...]`, or None."""
        matrices = torch_products.as_matrices(x, kernel, contracted)
        if matrices is None:
            return None
        x, kernel, shape = matrices
        return torch_products.matrix_product(x, kernel).reshape(shape)

    def matmul(x1, x2):
        if _calling.direct and type(x1) is torch.Tensor and getattr(x2, "ndim", None) == 2:
            if x1.dtype == torch.int8:
                product = int8_product(x1, x2, 1)
            elif x1.is_floating_point() and x1.ndim >= 2:
                product = float_product(x1, x2, 1)
            else:
                product = None
            if product is not None:
                return product
        return keras_matmul(x1, x2)

    def einsum(subscripts, *operands, **kwargs):
        x = operands[0] if operands else None
        if len(operands) == 2 and not kwargs and _calling.direct and type(x) is torch.Tensor:
            contracted = torch_products.matrix_product_form(subscripts)
            if contracted is None and x.dtype == torch.int8 and _rows_by_rows_form(subscripts):
                kernel = operands[1].value if isinstance(operands[1], keras.Variable) else operands[1]
                product = int8_product(x, kernel.t(), 1)
                if product is not None:
                    return product
            if contracted is not None:
                if x.dtype == torch.int8:
                    product = int8_product(x, operands[1], contracted)
                elif x.is_floating_point():
                    product = float_product(x, operands[1], contracted)
                else:
                    product = None
                if product is not None:
                    return product
        return keras_einsum(subscripts, *operands, **kwargs)

    environment.replace_in_modules("keras.src.backend", keras_matmul, matmul)
    environment.replace_in_modules("keras.src.backend", keras_einsum, einsum)


def _install_torch_input_quantizer():
    """Replaces Keras's `abs_max_quantize` (which its int8 layers call on
    their inputs) by one that, while decoding directly, computes it with
    torch's operations; otherwise, or for inputs other than float32 torch
    tensors or axes other than ints, it is Keras's own."""
    import torch
    from keras.src.quantizers import quantizers

    keras_quantize = quantizers.abs_max_quantize

    def abs_max_quantize(
        inputs, axis, value_range=(-127, 127), dtype="int8", epsilon=keras.config.epsilon(), to_numpy=False
    ):
        if (
            not _calling.direct
            or to_numpy
            or type(inputs) is not torch.Tensor
            or inputs.dtype != torch.float32
            or not isinstance(axis, int)
            or dtype != "int8"
        ):
            return keras_quantize(inputs, axis, value_range, dtype, epsilon, to_numpy)
        low, high = value_range
        # Keras's operations, in Keras's order, in float32.
        largest = torch.amax(torch.abs(inputs), dim=axis, keepdim=True)
        scale = torch.divide(high, torch.add(largest, epsilon))
        outputs = torch.clip(torch.round(torch.multiply(inputs, scale)), low, high)
        return outputs.to(torch.int8), scale

    environment.replace_in_modules("keras.src.quantizers", keras_quantize, abs_max_quantize)


def _install_plain_custom_gradients():
    """Replaces torch's `custom_gradient` by one whose functions, called
    while decoding directly, return their output without the
    `torch.autograd.Function` around them; otherwise it is Keras's own."""
    from keras.src.backend.torch import core

    keras_custom_gradient = core.custom_gradient

    class custom_gradient(keras_custom_gradient):
        def __call__(self, *args, **kwargs):
            if not _calling.direct:
                return super().__call__(*args, **kwargs)
            outputs = self.forward_fn(*args, **kwargs)
            try:
                output, _ = outputs  # (output, gradient function), as Keras unpacks it
            except (TypeError, ValueError):
                return outputs
            return output

    environment.replace_in_modules("keras.src.backend", keras_custom_gradient, custom_gradient)


class _TracedLoops:
    """The traced conditions and bodies of one `CompiledFunction`'s loops.

    `torch.jit.trace` records the torch operations that one call of a
    function runs. The tensors it is given become the trace's inputs; any
    other tensor the function reads becomes a constant of the trace. A loop
    body reads more than its loop variables: the model's weights, and
    tensors of the functions around it (the encoder's keys and values, each
    sentence's length limit), which change from call to call. So those are
    found and given to the trace as inputs too: the tensors in the
    function's closure, in the functions, lists, tuples and dicts there, in
    turn, and the model's variables. A trace is kept for everything else
    those closures hold: the code of each function, Python numbers and
    strings by value, and other objects (the model, its layers) by identity,
    taken as they are when first traced, as TensorFlow and JAX take them
    when they compile a function for the first time. A function that cannot
    be traced (a loop variable that is not a tensor, an operation the
    tracer refuses) runs through Keras's loop.

    Args:
        model: the model whose weights the loops read.
        size: the most traces kept; the least recently used goes first.
            A translator meets a condition and a body per phase of the
            growing caches (up to 7) per bucket of source lengths (10 up to
            256 tokens): 140 shapes. With 16 kept, a file of many buckets
            traced its loops again at every pass (the quick start's test
            set under torch: 36 traces a pass, half the speed).

    `count` counts the functions traced; `refused`, those the tracer
    refused.
    """

    def __init__(self, model, size=256):
        self.model = model
        self.size = size
        self.count = 0
        self.refused = 0
        self._traces = collections.OrderedDict()  # key -> (traced function or None, objects)

    def function(self, function, loop_vars):
        """`function(*loop_vars)` as a function of the flat loop variables
        that returns its flat outputs: traced, or an earlier trace; None if
        it cannot be traced."""
        import torch

        flat = keras.tree.flatten(loop_vars)
        if not all(type(x) is torch.Tensor for x in flat):
            return None
        key = [_structure(loop_vars)] + [(x.shape, x.dtype, x.device) for x in flat]
        extra, places, pinned = [], {}, []

        def place(tensor):  # the closure's tensors and the weights, once each
            if id(tensor) not in places:
                places[id(tensor)] = len(extra)
                extra.append(tensor)
            return places[id(tensor)]

        if not _closure_key(function, place, key, pinned, set()):
            return None
        variables = self.model.variables
        key.append(tuple((id(v), tuple(v.shape), v.dtype) for v in variables))
        for variable in variables:
            place(variable.value)
        key = tuple(key)
        if key in self._traces:
            self._traces.move_to_end(key)
            traced = self._traces[key][0]
        else:
            traced = self._trace(function, loop_vars, flat, extra)
            if traced is None:
                self.refused += 1
            else:
                self.count += 1
            # The objects are kept with the trace, so that no identity in
            # its key is reused by another object.
            self._traces[key] = traced, pinned
            while len(self._traces) > self.size:
                self._traces.popitem(last=False)
        if traced is None:
            return None
        return lambda *flat_vars: traced(*flat_vars, *extra)

    @staticmethod
    def _trace(function, loop_vars, flat, extra):
        import torch

        def flat_function(*inputs):
            flat_vars = inputs[: len(flat)]
            outputs = function(*keras.tree.pack_sequence_as(loop_vars, flat_vars))
            return tuple(keras.tree.flatten(outputs))

        # Each loop variable enters as a new tensor object (`detach` makes
        # one without copying), so that the tracer tells it apart from
        # another loop variable or a tensor of the closure that is the same
        # object now but may not be at a later step.
        inputs = tuple(x.detach() for x in flat) + tuple(extra)
        try:
            with warnings.catch_warnings():
                # The tracer warns of every Python number taken from a
                # shape; shapes are fixed within a trace.
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                # torch 2.13 marks `torch.jit.trace` deprecated in favour of
                # `torch.compile` (benchmarks/README.md: far slower to
                # start here) and `torch.export`; where it is gone, the
                # loops run eagerly.
                warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated", DeprecationWarning)
                return torch.jit.trace(flat_function, inputs, check_trace=False)
        except Exception:  # noqa: BLE001 - what the tracer refuses runs eagerly
            return None


def _structure(nest):
    """The shape of a nest of lists, tuples and dicts, without its leaves."""
    kind = type(nest)
    if kind in (list, tuple):
        return kind, tuple(_structure(item) for item in nest)
    if kind is dict:
        return dict, tuple((name, _structure(nest[name])) for name in sorted(nest))
    return None


def _closure_key(value, place, key, pinned, seen):
    """Adds to `key` what the trace of a function takes as fixed in
    `value`, and `place`s the tensors it must take as inputs. False if
    `value` holds something neither fixed nor a tensor."""
    import torch

    kind = type(value)
    if isinstance(value, torch.Tensor):
        key.append(("tensor", place(value), value.shape, value.dtype, value.device))
    elif isinstance(value, keras.Variable):
        key.append(("variable", place(value.value), tuple(value.shape), value.dtype))
    elif value is None or kind in (bool, int, float, complex, str, bytes) or isinstance(value, np.generic):
        key.append((kind, value))
    elif kind in (list, tuple, dict):
        items = [value[name] for name in sorted(value)] if kind is dict else value
        key.append((kind, tuple(sorted(value)) if kind is dict else len(value)))
        return all(_closure_key(item, place, key, pinned, seen) for item in items)
    elif kind is types.FunctionType:
        key.append(("function", value.__code__))
        if id(value) in seen:  # a function that refers to itself
            return True
        seen.add(id(value))
        pinned.append(value)
        cells = value.__closure__ or ()
        parts = [value.__defaults__ or (), value.__kwdefaults__ or {}]
        for cell in cells:
            try:
                parts.append(cell.cell_contents)
            except ValueError:  # a name not yet bound
                parts.append(None)
        return all(_closure_key(part, place, key, pinned, seen) for part in parts)
    elif kind is types.MethodType:
        key.append(("method", value.__func__.__code__, id(value.__self__)))
        pinned.append(value.__self__)
    elif isinstance(value, np.ndarray):
        return False  # neither fixed nor a tensor the trace can take in
    else:  # modules, classes, the model and its layers: by identity
        key.append(("object", id(value)))
        pinned.append(value)
    return True


def _install_traced_loops():
    """Replaces torch's `while_loop` by one that, while decoding directly
    with traces (`_TracedLoops`), calls the traced condition and body;
    otherwise, or if either cannot be traced, it is Keras's own."""
    from keras.src.backend.torch import core

    keras_while_loop = core.while_loop

    def while_loop(cond, body, loop_vars, maximum_iterations=None):
        loops = _calling.loops
        if loops is None or not _calling.direct:
            return keras_while_loop(cond, body, loop_vars, maximum_iterations)
        is_tuple = isinstance(loop_vars, (tuple, list))
        loop_vars = tuple(loop_vars) if is_tuple else (loop_vars,)
        loop_vars = keras.tree.map_structure(core.convert_to_tensor, loop_vars)
        traced_body = loops.function(body, loop_vars)
        traced_cond = traced_body and loops.function(cond, loop_vars)
        if traced_cond is None:
            return keras_while_loop(cond, body, loop_vars if is_tuple else loop_vars[0], maximum_iterations)
        flat = keras.tree.flatten(loop_vars)
        iterations = 0
        while (maximum_iterations is None or iterations < maximum_iterations) and bool(traced_cond(*flat)[0]):
            flat = traced_body(*flat)
            iterations += 1
        loop_vars = keras.tree.pack_sequence_as(loop_vars, list(flat))
        return loop_vars if is_tuple else loop_vars[0]

    environment.replace_in_modules("keras.src.backend", keras_while_loop, while_loop)


# Under TensorFlow without XLA, Keras's int8 layers multiply int8 by int8
# with `tf.matmul(..., output_type=tf.int32)`, which on this CPU is 4-5 times
# slower than the float32 product of the same shapes (benchmarks/README.md:
# 128 x 512 by 512 x 32,000, 72.6 ms against 16.0 ms), where the same int8
# values cast to float32 and multiplied as floats take 17.1 ms. So while a
# decoding function is traced without XLA, int8 products are float32
# products of the int8 values. Their sums are exact up to 2^24 (a
# contraction of up to 1,040 int8 pairs), and beyond that rounded to 24
# bits, which the int8 layers' rescaling into floats does anyway. With XLA
# the int8 product is faster than the float32 one, and is left as it is.

@contextlib.contextmanager
def _float_int8_products():
    """Within this block, on this thread, TensorFlow's int8 by int8
    `matmul` and `einsum` are float32 products cast to int32."""
    outer = _calling.float_int8
    _calling.float_int8 = True
    try:
        yield
    finally:
        _calling.float_int8 = outer


@functools.cache
def _install_float_int8_products():
    import tensorflow as tf
    from keras.src.backend.tensorflow import numpy as tf_numpy
    from keras.src.backend.tensorflow import core

    keras_matmul = tf_numpy.matmul
    keras_einsum = tf_numpy.einsum

    def int8(x):
        return keras.backend.standardize_dtype(getattr(x, "dtype", None) or "float32") == "int8"

    def as_float(x):
        return tf.cast(core.convert_to_tensor(x), tf.float32)

    def matmul(x1, x2):
        if _calling.float_int8 and int8(x1) and int8(x2):
            return tf.cast(keras_matmul(as_float(x1), as_float(x2)), tf.int32)
        return keras_matmul(x1, x2)

    def einsum(subscripts, *operands, **kwargs):
        if _calling.float_int8 and len(operands) == 2 and all(int8(x) for x in operands):
            product = keras_einsum(subscripts, *(as_float(x) for x in operands), **kwargs)
            return tf.cast(product, tf.int32)
        return keras_einsum(subscripts, *operands, **kwargs)

    environment.replace_in_modules("keras.src.backend", keras_matmul, matmul)
    environment.replace_in_modules("keras.src.backend", keras_einsum, einsum)


# XLA:CPU multiplies one int8 row by an int8 matrix, a matrix-vector
# product, several times slower than two rows: in a `jax.jit` product
# (ad hoc, benchmarks/README.md) 1 x 512 by 512 x 2,048 took 359 us and
# 2 x 512 by the same 92 us, while float32 rows took 97 and 110 us; under
# TensorFlow with XLA, one int8 row took 2.6-3.4 times as long as two. A greedy
# search at batch 1 multiplies single rows at every step. So while a
# function is traced for XLA, an int8 by int8 `matmul`, matrix-product
# `einsum` (Keras's int8 `Dense` and `EinsumDense`) or rows-by-rows `einsum`
# (`td,vd->tv`, our int8 embedding's logits) whose input is one row
# multiplies that row beside a row of zeros and keeps the first row of the
# int32 sums: the same sums.

@functools.cache
def _install_paired_int8_rows(backend):
    """Installs the above for `backend` ("jax" or "tensorflow")."""
    backend_numpy = importlib.import_module(f"keras.src.backend.{backend}.numpy")
    keras_matmul = backend_numpy.matmul
    keras_einsum = backend_numpy.einsum
    ops = keras.ops

    def int8(x):
        return keras.backend.standardize_dtype(x.dtype) == "int8"

    def rows_by_rows(x, kernel):
        """int8 x `[M, K]` times int8 kernel `[N, K]` transposed, in int32.
        Under TensorFlow with XLA, as a batch of M one-row products by the
        transposed kernel, as Keras's `matmul` of `[M, 1, K]` states
        computes it: Keras's `einsum` of that form, or a 2-D `matmul` by the
        transposed kernel, made the small model's int8 beam search at batch
        32 2.7 times slower (ad hoc, benchmarks/README.md)."""
        if backend == "tensorflow":
            return keras_matmul(x[:, None, :], ops.transpose(kernel))[:, 0, :]
        return keras_einsum("td,vd->tv", x, kernel)

    def single_int8_row(x, kernel, depth_shape):
        """x as one `[1, K]` row when x and kernel are int8 and x is a
        single row of `depth_shape` (static shapes); otherwise None."""
        shape = tuple(x.shape)
        leading = shape[: len(shape) - len(depth_shape)]
        if not (int8(x) and int8(kernel)) or None in shape or shape[len(leading) :] != depth_shape:
            return None
        return ops.reshape(x, (1, math.prod(depth_shape))) if math.prod(leading) == 1 else None

    def paired(row, product):
        """`product(rows)` of `row` and a row of zeros, and its first row."""
        return product(ops.concatenate([row, ops.zeros_like(row)], axis=0))[:1]

    def matmul(x1, x2):
        if _calling.xla:
            x1, x2 = ops.convert_to_tensor(x1), ops.convert_to_tensor(x2)
            if len(x2.shape) == 2:
                row = single_int8_row(x1, x2, tuple(x2.shape[:1]))
                if row is not None:
                    sums = paired(row, lambda rows: keras_matmul(rows, x2))
                    return ops.reshape(sums, tuple(x1.shape[:-1]) + tuple(x2.shape[1:]))
        return keras_matmul(x1, x2)

    def einsum(subscripts, *operands, **kwargs):
        if _calling.xla and len(operands) == 2 and not kwargs:
            x, kernel = (ops.convert_to_tensor(operand) for operand in operands)
            contracted = torch_products.matrix_product_form(subscripts)
            if contracted is not None:
                depth_shape = tuple(kernel.shape[:contracted])
                row = single_int8_row(x, kernel, depth_shape)
                if row is not None:
                    matrix = ops.reshape(kernel, (math.prod(depth_shape), -1))
                    sums = paired(row, lambda rows: keras_matmul(rows, matrix))
                    return ops.reshape(sums, tuple(x.shape[: len(x.shape) - contracted]) + tuple(kernel.shape[contracted:]))
            elif _rows_by_rows_form(subscripts) and int8(x) and int8(kernel):
                row = single_int8_row(x, kernel, tuple(kernel.shape[1:]))
                if row is not None:
                    return paired(row, lambda rows: rows_by_rows(rows, kernel))
                return rows_by_rows(x, kernel)
        return keras_einsum(subscripts, *operands, **kwargs)

    environment.replace_in_modules("keras.src.backend", keras_matmul, matmul)
    environment.replace_in_modules("keras.src.backend", keras_einsum, einsum)
