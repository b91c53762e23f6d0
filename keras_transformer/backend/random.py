"""Seeded dropout under torch on an accelerator, without waiting for it.

Keras's seeded `Dropout` keeps its stream's position (a `SeedGenerator`'s
two counters) in a variable on the default device, and under torch each
call reads the next seed back as a Python integer to seed a
`torch.Generator`. On a GPU that read waits for all the work queued before
it, and the counters' step copies a constant to the device: a training step
of the small model stops the host 17 times that way, where Keras's torch
backend has no time to lose (it keeps the GPU fed one operation at a time).

What it does:

- `host_stream_scope()`: the seed streams created inside it keep their
  counters in host memory (under torch; elsewhere nothing changes).
- `dropout(inputs, rate, noise_shape, seed_generator)`: under torch, with
  the counters in host memory, the seed is drawn there (the sum of the two
  counters, as Keras derives it) and the mask on the inputs' device, from
  the same generator draws as Keras's torch dropout, so that the mask is
  the one Keras's dropout draws from the same seed. Everywhere else, for an
  unseeded stream (torch's own fused dropout), and inside `torch.compile`
  (`jit_compile=True`), it is Keras's dropout.
"""

import contextlib
import functools
import threading

import keras

from keras_transformer.backend.keras_private import in_stateless_scope


def host_stream_scope():
    """A context in which new seed streams keep their counters on the host."""
    if keras.backend.backend() != "torch":
        return contextlib.nullcontext()
    return keras.device("cpu")


def dropout(inputs, rate, noise_shape, seed_generator):
    """`inputs` with each entry zeroed with probability `rate` and the rest
    scaled by 1 / (1 - rate), the mask drawn from `seed_generator`'s next seed
    (Keras's `keras.random.dropout`)."""
    if keras.backend.backend() != "torch":
        return keras.random.dropout(inputs, rate, noise_shape=noise_shape, seed=seed_generator)
    import torch

    if (
        not torch.compiler.is_compiling()  # where Keras's own stays out of the graph
        and noise_shape is None
        and 0.0 < rate < 1.0
        and type(inputs) is torch.Tensor
        and inputs.device.type != "meta"
        and seed_generator.get_config()["seed"] is not None
        and seed_generator.state.value.device.type == "cpu"
    ):
        return _dropout_with_host_seed()(inputs, rate, seed_generator)
    return keras.random.dropout(inputs, rate, noise_shape=noise_shape, seed=seed_generator)


def next_seed(seed_generator):
    """The 32-bit seed of the stream's next draw, as Keras's torch backend
    derives it from the two counters (their int32 sum, as uint32), and the
    stream advanced by one draw (the second counter plus one, in int32)."""
    if in_stateless_scope():  # the counters' value is the scope's: Keras's draw
        with keras.device("cpu"):
            first, second = seed_generator.next()
            return int(first + second) & 0xFFFFFFFF
    # The counters, int32 [2] in host memory, read and advanced through a
    # NumPy view of their memory: no torch operations for the host to launch.
    counters = seed_generator.state.value.numpy()
    first, second = int(counters[0]), int(counters[1])
    counters[1:] += 1  # an array's addition, which wraps in int32 as Keras's does
    return (first + second) & 0xFFFFFFFF


@functools.cache
def _dropout_with_host_seed():
    """The host-seeded dropout, made once (torch._dynamo loads on first use)."""
    import torch._dynamo

    # One generator per device and thread, seeded anew for each mask: the
    # draws of a new generator with that seed, without making one each time.
    generators = threading.local()
    # Per device and rate, the keep probability as a float32 scalar there;
    # per device and dtype, a zero (a Python 0.0 is made a tensor per call).
    probabilities = {}
    zeros = {}

    # torch's compiler does not take generators (as Keras's backend notes).
    @torch._dynamo.disable
    def dropout_with_host_seed(inputs, rate, seed_generator):
        per_device = generators.__dict__
        generator = per_device.get(inputs.device)
        if generator is None:
            generator = per_device[inputs.device] = torch.Generator(device=inputs.device)
        generator.manual_seed(next_seed(seed_generator))
        keep_probability = 1.0 - rate
        probability = probabilities.get((inputs.device, keep_probability))
        if probability is None:
            probability = torch.full((), keep_probability, device=inputs.device)
            probabilities[(inputs.device, keep_probability)] = probability
        # Keras fills a float32 tensor with the probability, draws from it
        # and casts the draws to bool: three passes over the inputs' size.
        # The same draws land in a bool tensor from the probability's
        # broadcast view, in one (tests/test_dropout.py).
        keep = torch.empty(inputs.shape, dtype=torch.bool, device=inputs.device)
        keep.bernoulli_(probability.expand(inputs.shape), generator=generator)
        # A zero where Keras's has `zeros_like(inputs)`: the same values, one
        # operation less.
        zero = zeros.get((inputs.device, inputs.dtype))
        if zero is None:
            zero = zeros[(inputs.device, inputs.dtype)] = torch.zeros((), dtype=inputs.dtype, device=inputs.device)
        return torch.where(keep, inputs / keep_probability, zero)

    return dropout_with_host_seed
