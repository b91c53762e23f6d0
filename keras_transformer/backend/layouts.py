"""The order in memory of a kernel's numbers, under torch.

Keras keeps a kernel `[K, N]` row by row: an input's weights lie together.
torch's `Linear` keeps its weight `[N, K]`: an output's weights lie
together, and oneDNN multiplies a single row by a weight kept so at about
twice the rate, reading each output's weights in one stream (the 48
decoder products of a greedy step of a converted OPUS-MT model: 3.9 ms
against 6.5 ms for torch's `addmm` of Keras's order, on 2 cores of an AMD
EPYC). Transposing the kernels at each decoding call costs more than a
short sentence saves (30 ms for those 88 MB), and a copy kept between
calls could go stale when the weights change.

So the order is chosen when a kernel is made: inside `linear_order()`, our
layers' float kernels are made in torch's order. Each is still a `[K, N]`
tensor (a transposed view of the `[N, K]` block), so assigning, saving,
quantizing and training see the same values; only their place in memory
differs. `Translator.load` builds its model so. Training builds Keras's
order: Keras's optimizers keep their moments in it, and an update that
reads both orders strides across one of them.
"""

import contextlib
import contextvars
import math

import keras

_LINEAR_ORDER = contextvars.ContextVar("keras_transformer_linear_order", default=False)


@contextlib.contextmanager
def linear_order():
    """Under torch, the float kernels our layers make inside this context
    lie in memory as torch's `Linear` weights do (`[N, K]`, an output's
    weights together); elsewhere it changes nothing."""
    token = _LINEAR_ORDER.set(True)
    try:
        yield
    finally:
        _LINEAR_ORDER.reset(token)


def kernel_initializer(initializer, contracted):
    """`initializer` of a kernel `[K..., N...]` whose first `contracted`
    axes are contracted with the input: as given outside `linear_order`, or
    under another backend; otherwise one whose values lie in torch's order."""
    if not _LINEAR_ORDER.get() or keras.backend.backend() != "torch" or not contracted:
        return initializer
    initializer = keras.initializers.get(initializer)

    def initialize(shape, dtype=None):
        value = keras.ops.convert_to_tensor(initializer(shape, dtype=dtype))
        if not value.is_floating_point() or value.ndim <= contracted:
            return value
        depth = math.prod(shape[:contracted])
        # [K, N] as a view of the [N, K] block; the reshape splits axes of
        # a view, so it stays one.
        return value.reshape(depth, -1).t().contiguous().t().reshape(tuple(shape))

    return initialize


def in_linear_order(kernel):
    """Whether a torch kernel `[K, N]` lies in torch's order (its transpose
    is contiguous) and not Keras's."""
    return kernel.ndim == 2 and not kernel.is_contiguous() and kernel.t().is_contiguous()
