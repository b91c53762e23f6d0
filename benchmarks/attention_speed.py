"""cuDNN's fused attention against XLA's, per sentence length, under JAX.

    KERAS_BACKEND=jax python benchmarks/attention_speed.py --lengths 16 32 64 128 256

The attention of the base model's shape (8 heads of 64) in bfloat16, forward
and backward, at about `--tokens` positions a batch (`batch = tokens //
length`), through `keras_transformer.backend.attention.dot_product_attention`
as our layers call it: once as it chooses on this machine (cuDNN's kernel on
a GPU) and once inside `attention.xla_attention()`. Two masks: an encoder's
padding mask `[B, 1, S]` and a decoder's padding and causal mask `[B, T, S]`,
each sentence padded after a random length. Reported per length and mask:
the median milliseconds of `--repeats` calls, and XLA / chosen (above 1:
the choice is faster).
"""

import argparse
import json
import statistics
import sys
import time

import keras

if keras.backend.backend() != "jax":
    sys.exit(f"error: attention_speed.py times JAX's attention; run it with KERAS_BACKEND=jax, not {keras.backend.backend()}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer.backend import attention  # noqa: E402

HEADS, HEAD_SIZE = 8, 64


def inputs(length, tokens, causal, seed=0):
    rng = np.random.default_rng(seed)
    batch = max(1, tokens // length)
    shape = (batch, length, HEADS, HEAD_SIZE)
    query, key, value = (jnp.asarray(rng.normal(size=shape), jnp.bfloat16) for _ in range(3))
    lengths = rng.integers(1, length + 1, batch)
    mask = np.arange(length)[None, None, :] < lengths[:, None, None]  # [B, 1, S]
    if causal:
        mask = mask & np.tril(np.ones((length, length), bool))[None]  # [B, T, S]
    return query, key, value, jnp.asarray(mask)


def timed(function, arguments, repeats):
    jax.block_until_ready(function(*arguments))  # compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(function(*arguments))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def forward_and_backward(xla):
    def loss(query, key, value, mask):
        attended = attention.dot_product_attention(query, key, value, mask, HEAD_SIZE**-0.5)
        return attended.astype(jnp.float32).sum()

    gradient = jax.grad(loss, argnums=(0, 1, 2))

    def traced(query, key, value, mask):
        if xla:
            with attention.xla_attention():
                return gradient(query, key, value, mask)
        return gradient(query, key, value, mask)

    return jax.jit(traced)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--tokens", type=int, default=25000, help="positions a batch")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="where to write the rows")
    args = parser.parse_args()
    if min(args.lengths) < 2 or args.tokens < 2 or args.repeats < 1:
        parser.error("--lengths and --tokens must be >= 2, --repeats >= 1")
    device = jax.devices()[0]
    rows = []
    print(f"{device.device_kind}: attention of {HEADS} heads of {HEAD_SIZE}, bfloat16, forward and backward, "
          f"about {args.tokens:,} positions a batch\n")
    print("| length | mask | chosen implementation | chosen ms | XLA ms | XLA / chosen |")
    print("| ---: | --- | --- | ---: | ---: | ---: |")
    for length in args.lengths:
        for causal in (False, True):
            arguments = inputs(length, args.tokens, causal)
            chosen = attention.jax_implementation(arguments[0], arguments[1])
            fused = timed(forward_and_backward(xla=False), arguments, args.repeats)
            xla = timed(forward_and_backward(xla=True), arguments, args.repeats)
            mask = "padding and causal" if causal else "padding"
            rows.append({"length": length, "mask": mask, "chosen": chosen, "chosen_seconds": fused,
                         "xla_seconds": xla})
            print(f"| {length} | {mask} | {chosen} | {fused * 1000:.3f} | {xla * 1000:.3f} | {xla / fused:.2f} |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"device": device.device_kind, "tokens": args.tokens, "rows": rows}, file, indent=2)


if __name__ == "__main__":
    sys.exit(main())
