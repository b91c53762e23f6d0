"""Decoding speed: cached search against recomputation and against keras-hub.

    python benchmarks/decoding.py                          # small and base presets
    KERAS_BACKEND=jax python benchmarks/decoding.py
    python benchmarks/decoding.py --presets small --repeats 5

For each preset, one batch of 32 random source sentences of 20 tokens (plus
EOS) is decoded to 40 output tokens by:

- greedy search and beam search (beam 4) with the cached decoder
  (`keras_transformer.decoding.search_translations`);
- the same beam search with a step function that recomputes the decoder
  over the whole 40-position target buffer at every step, without a cache
  (the encoder still runs once);
- `keras_hub.samplers.BeamSampler` (beam 4) driving a stack of keras-hub
  `TransformerDecoder` layers of the same size with their self-attention
  and cross-attention caches, as keras-hub's BART does.

All routes run under the same compilation (a `tf.function`, or `jax.jit`,
or eager torch without autograd; ours calls its built layers' `call`
directly there, keras-hub's route goes through `Layer.__call__` as in
keras-hub), and EOS never stops them (the weights are
random), so each does exactly 40 steps. The figures are sentences per
second, best of `--repeats` runs after one warm-up run.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.decoding import beam_search  # noqa: E402
from keras_transformer.decoding import search_translations  # noqa: E402
from keras_transformer.decoding.compiled import CompiledFunction  # noqa: E402

BOS, EOS, NEVER = 2, 3, -1


def recomputing_beam_search(model, source_ids, max_length, beam_size, decoding=None):
    """Beam search whose step runs the whole decoder over the target buffer."""
    encoder_output, encoder_padding_mask = model.encode(source_ids, decoding=decoding)
    encoder_output = ops.repeat(encoder_output, beam_size, axis=0)
    encoder_padding_mask = ops.repeat(encoder_padding_mask, beam_size, axis=0)

    def step_fn(ids, index, state):
        x = model._decode(ids[:, :max_length], encoder_output, encoder_padding_mask, training=False, decoding=decoding)
        # Only the newest position's logits are needed.
        x = ops.slice(x, [0, index, 0], [ops.shape(x)[0], 1, model.d_model])
        return model._logits(x, decoding)[:, 0], state

    batch_size = ops.shape(source_ids)[0]
    return beam_search(
        step_fn,
        ops.full((batch_size,), BOS, dtype="int32"),
        ops.zeros((batch_size, 1)),
        beam_size=beam_size,
        max_length=max_length,
        eos_id=NEVER,
        decoding=decoding,
    )


class KerasHubDecoder(keras.layers.Layer):
    """Embedding, sine positions and `TransformerDecoder`s from keras-hub."""

    def __init__(self, vocabulary_size, num_layers, d_model, d_ff, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.embedding = keras_hub.layers.ReversibleEmbedding(vocabulary_size, d_model)
        self.position_encoding = keras_hub.layers.SinePositionEncoding()
        self.decoders = [
            keras_hub.layers.TransformerDecoder(d_ff, num_heads, dropout=0.1)
            for _ in range(num_layers)
        ]

    def build(self, encoder_output_shape):
        self.embedding.build((None, None))
        shape = (None, None, self.d_model)
        for decoder in self.decoders:
            decoder.build(shape, encoder_output_shape)
        self.built = True

    def cross_attention_cache(self, encoder_output):
        """Keys and values of the encoder output per layer: [B, L, 2, S, N, H]."""
        caches = []
        for decoder in self.decoders:
            attention = decoder._cross_attention_layer
            caches.append(
                ops.stack(
                    [attention._key_dense(encoder_output), attention._value_dense(encoder_output)],
                    axis=1,
                )
            )
        return ops.stack(caches, axis=1)

    def call_with_cache(self, token_ids, self_cache, cross_cache, index):
        x = self.embedding(token_ids) * ops.sqrt(ops.cast(self.d_model, "float32"))
        x = x + self.position_encoding(x, start_index=index)
        updated = []
        for i, decoder in enumerate(self.decoders):
            # The layer requires an encoder sequence once built with one;
            # given a cross-attention cache without an update index it
            # reads keys and values from the cache only.
            x, layer_cache, _ = decoder(
                x,
                x,
                self_attention_cache=self_cache[:, i],
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache[:, i],
                cross_attention_cache_update_index=None,
            )
            updated.append(layer_cache)
        return self.embedding(x, reverse=True)[:, 0], ops.stack(updated, axis=1)


class Weights(keras.layers.Layer):
    """The weights of several layers as one, for `CompiledFunction`
    (`jax.jit` takes every variable a function reads as an input)."""

    def __init__(self, *layers):
        super().__init__()
        self.parts = list(layers)


def random_sources(rng, batch_size, source_length, vocabulary_size):
    """int32 `[batch_size, source_length + 1]`: random word ids, then EOS."""
    words = rng.integers(4, vocabulary_size, (batch_size, source_length))
    return np.concatenate([words, np.full((batch_size, 1), EOS)], axis=1).astype("int32")


def keras_hub_search(model, hub_decoder, source_ids, max_length, sampler):
    """`sampler` (a keras-hub `GreedySampler` or `BeamSampler`) over the
    cached keras-hub decoder, from BOS to `max_length` tokens."""
    encoder_output, _ = model.encode(source_ids)
    batch_size = ops.shape(source_ids)[0]
    head_dim = model.d_model // model.num_heads
    self_cache = ops.zeros(
        (batch_size, model.num_layers, 2, max_length + 1, model.num_heads, head_dim)
    )
    cross_cache = hub_decoder.cross_attention_cache(encoder_output)
    prompt = ops.concatenate(
        [
            ops.full((batch_size, 1), BOS, dtype="int32"),
            ops.zeros((batch_size, max_length), dtype="int32"),
        ],
        axis=1,
    )

    def next_fn(prompt, cache, index):
        token_ids = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
        self_cache, cross_cache = cache
        logits, self_cache = hub_decoder.call_with_cache(
            token_ids, self_cache, cross_cache, index - 1
        )
        return logits, None, (self_cache, cross_cache)

    return sampler(
        next_fn,
        prompt,
        cache=(self_cache, cross_cache),
        index=1,
        mask=ops.equal(prompt, BOS),
        # Under JAX the sampler's loop maps the variables of `model` to the
        # compiled function's inputs, as keras-hub's `generate` passes its
        # model; without it the decoder's weights became constants of the
        # program, which XLA could lay out and fold ahead of time.
        model=hub_decoder,
    )


def keras_hub_beam_search(model, hub_decoder, source_ids, max_length, beam_size):
    sampler = keras_hub.samplers.BeamSampler(num_beams=beam_size)
    return keras_hub_search(model, hub_decoder, source_ids, max_length, sampler)


def timed(function, inputs, repeats):
    for _ in range(2):  # compiles; under torch the loops are recorded at the second call
        function(*inputs)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function(*inputs)
        best = min(best, time.perf_counter() - start)
    return best


def benchmark(preset, args):
    model = kt.build_transformer(preset, vocabulary_size=args.vocabulary_size)
    config = kt.models.PRESETS[preset]
    hub_decoder = KerasHubDecoder(
        args.vocabulary_size, config["num_layers"], config["d_model"], config["d_ff"], config["num_heads"]
    )
    hub_decoder.build((None, None, config["d_model"]))
    rng = np.random.default_rng(0)
    source_ids = random_sources(rng, args.batch_size, args.source_length, args.vocabulary_size)
    max_length = args.output_length
    extra = max_length - source_ids.shape[1]
    limits = np.full((args.batch_size,), max_length, "int32")

    def ours(beam_size):
        return lambda source, limit, decoding: search_translations(
            model, source, limit, beam_size=beam_size, alpha=0.6,
            max_extra_length=extra, bos_id=BOS, eos_id=NEVER, decoding=decoding,
        )

    routes = {
        "greedy, cached": (ours(1), model, (source_ids, limits)),
        "beam 4, cached": (ours(4), model, (source_ids, limits)),
        "beam 4, recomputed": (
            lambda source, decoding: recomputing_beam_search(model, source, max_length, 4, decoding),
            model,
            (source_ids,),
        ),
        "beam 4, keras-hub BeamSampler": (
            lambda source, decoding: keras_hub_beam_search(model, hub_decoder, source, max_length, 4),
            Weights(model, hub_decoder),
            (source_ids,),
        ),
    }
    rates = {}
    for name, (fn, owner, inputs) in routes.items():
        if name == "beam 4, recomputed" and preset in args.skip_recompute:
            continue
        compiled = CompiledFunction(
            fn, owner, [x.ndim for x in inputs], jit_compile=args.jit_compile,
            direct_layer_calls="keras-hub" not in name,  # keras-hub's layers as keras-hub runs them
        )
        repeats = 1 if "recomputed" in name else args.repeats
        seconds = timed(compiled, inputs, repeats)
        rates[name] = args.batch_size / seconds
        print(f"  {preset:5s} {name:32s} {rates[name]:8.1f} sentences/s  ({seconds:.2f} s per batch)", flush=True)
    cached = rates["beam 4, cached"]
    if "beam 4, recomputed" in rates:
        print(f"  {preset:5s} cache speedup (beam 4): {cached / rates['beam 4, recomputed']:.1f}x")
    print(f"  {preset:5s} ours / keras-hub (beam 4): {cached / rates['beam 4, keras-hub BeamSampler']:.2f}x")
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--output-length", type=int, default=40)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jit-compile", action="store_true", help="XLA under TensorFlow")
    parser.add_argument("--skip-recompute", nargs="*", default=[], help="presets to skip it for")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    print(
        f"backend {keras.backend.backend()}"
        + (" (XLA)" if args.jit_compile and keras.backend.backend() == "tensorflow" else "")
        + f"; batch {args.batch_size}, {args.source_length} source tokens + EOS, "
        f"{args.output_length} output tokens, vocabulary {args.vocabulary_size}"
    )
    for preset in args.presets:
        benchmark(preset, args)


if __name__ == "__main__":
    main()
