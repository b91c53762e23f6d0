"""Decoding speed against the engines people deploy: keras-hub, transformers, CTranslate2.

    pip install -e ".[benchmarks]"     # keras-hub, transformers and ctranslate2
    python benchmarks/decoding_engines.py --json benchmarks/results/engines_tensorflow.json
    python benchmarks/decoding_engines.py --jit-compile        # XLA under TensorFlow
    KERAS_BACKEND=jax python benchmarks/decoding_engines.py --presets small --batch-sizes 32 --rounds 1
    python benchmarks/decoding_engines.py --peers recomputed   # the cache against recomputing the prefix
    KERAS_BACKEND=jax python benchmarks/decoding_engines.py --converted --json OUT   # a converted OPUS-MT model
    KERAS_BACKEND=jax python benchmarks/decoding_engines.py --converted --latency --json OUT   # one sentence at a time
    KERAS_BACKEND=jax python benchmarks/decoding_engines.py --presets base --batch-sizes 1 64 \
        --peers transformers --precisions float32 --rounds 5       # on a GPU machine
    KERAS_BACKEND=torch python benchmarks/decoding_engines.py --torch-paths --rounds 7 --json OUT

For each preset (small: 3+3 layers, d_model 256; base: 6+6, d_model 512) and
each batch size, the same random source sentences (20 tokens, then EOS) are
decoded to exactly `--output-length` tokens, greedily and with beam 4, by:

- ours: `search_translations` with the cached decoder, compiled as the
  `Translator` compiles it, in float32 and with Keras's int8 kernels and
  our int8 token embedding (`models.quantized`);
- `keras-hub`: its cached `GreedySampler` and `BeamSampler` driving a stack
  of keras-hub `TransformerDecoder` layers of the same size with their
  self-attention and cross-attention caches, as keras-hub's BART does, on
  our encoder;
- `transformers`: `MarianMTModel.generate` (greedy, `num_beams=4`), float32
  on torch, whatever the Keras backend, on torch's CUDA device where there
  is one: on a GPU machine, the same measurement as on a CPU;
- `ctranslate2`: that Marian model converted by CTranslate2's own
  converter, `translate_batch` on the CPU in float32 and in int8, each model
  in a process of its own (`_support.CTranslate2Processes`: in the
  benchmark's process, CTranslate2 slowed torch); its turns include sending
  the batch over a pipe and receiving the lengths;
- `recomputed` (asked for by name): our search with a step that runs the
  whole decoder over the target buffer at every step, without a cache (the
  encoder still runs once): what the cache buys.

All weights are random and EOS is banned (`eos_id=-1` for ours, keras-hub
has no stop token, `min_new_tokens` for transformers, `min_decoding_length`
for CTranslate2), so every system does the same number of steps; the tool
checks each output's length. The contenders take turns, one batch each per
round, for `--rounds` rounds after a warm-up call, so that the ratios share
the machine's noise; before each turn the machine idles `--settle` seconds,
so that no thread pool of the previous contender is still spinning
(CTranslate2's and torch's OpenMP threads spin for a while after their
work, and would slow whoever comes next). Reported: the median seconds per
batch, sentences per second, the model's GFLOP per second (`decoding_flops`:
the same count for every system, to set beside `precision.py
--matmul-peak`), and ours over each peer for the same search and precision
(ours in float32 where ours has no such precision).

`--converted [opus-mt-en-de|tiny]` times a converted OPUS-MT translator
instead: a random `MarianMTModel` with opus-mt-en-de's published size and
options (6+6 layers, d_model 512, 8 heads, feed-forward 2048, swish,
vocabulary 58,101, a logits bias, shared embeddings; no weights can be
downloaded here), saved in transformers' layout and converted three ways:
by `keras_transformer.convert` (ours), by CTranslate2's own converter, and
read back by transformers. The same weights in every engine; ours also in
int8 (`models.quantized`), against CTranslate2's int8. The logits bias puts
EOS 10,000 below every word, so that no engine can end a sentence early.

`--converted --latency [N]` measures what an interactive user waits for:
the first N (300) sentences of `--latency-source` (Multi30k's test2016.en
in ../shared/data), each decoded alone, greedily (`--latency-beam`), by ours
in float32 and int8 through the serving path, a `Translator` (sources padded
to its length buckets, one program each, compiled first by `warm_up([1])`,
whose programs and seconds are reported) calling `search_ids`, and by
CTranslate2 in float32 and int8, whose turns include the pipe's round trip.
The weights are random, so the sentences give only their lengths: each is
cut into subwords by a SentencePiece model trained on the file in the run,
each subword an arbitrary word of the model, then EOS; every engine decodes
each sentence to its source's tokens + 1, which the tool checks at every
turn. After each engine decodes the first 3 sentences untimed, the engines
take turns sentence by sentence, in rotating order, idling at most 20 ms
before each. Reported: each engine's p50, p95, p99, mean and max
milliseconds and total seconds, and ours' milliseconds over CTranslate2's
at p50 and p99, precision for precision (below 1: ours answers sooner).
Without `--batch-sizes`, `--latency` runs alone, without the batches.

`--converted --convert-memory` measures `convert` itself: a child process
imports the package (and what Keras imports at its first serialization:
TensorFlow, where it is installed), reads its resident memory, converts the
random OPUS-MT-size checkpoint (safetensors), and reports its peak resident
memory above that, over the model's float32 size (parameters x 4 bytes).

`--torch-paths` (Keras's torch backend) times what each of the package's
torch-only decoding paths buys, in the process settings `translate` runs
with: the same search with one path switched off at a time. Under torch a
translator's compiled function (`decoding.compiled`) has three: direct
calls (our built layers call each other's `call` without `Layer.__call__`,
`layers/calls.py`), recorded loops (the search's loops recorded with
torch.fx's `make_fx` once per shapes and replayed, `backend/loops.py`) and
the products (float32 products through oneDNN's linear operation or
torch's `matmul`, whichever a rule takes as the faster on this CPU,
`backend/products.py`). The variants are everything on; each path off in
turn (for the products, the other library's); and none of the first two,
which is Keras's own eager layers and loop. They take turns in a rotating
order, after two untimed calls each (the loops are recorded at the
second). Printed: sentences per second (median of the turns) and each
variant's speed over everything on (the median over rounds of the round's
ratio, which the machine's bursts of load disturb less). Training's
torch-only path is `training_speed.py --contenders ours_other_products`.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# JAX takes 75% of a GPU when it starts; leave room for torch's peer.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
if "--torch-paths" in sys.argv:
    # The process settings `translate` decodes with (`environment.configure_process`).
    os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _support import CTranslate2Processes  # noqa: E402
from _support import other_products  # noqa: E402
from keras import ops  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.decoding import beam_search  # noqa: E402
from keras_transformer.decoding import search_translations  # noqa: E402
from keras_transformer.decoding.compiled import CompiledFunction  # noqa: E402

BOS, EOS, NEVER = 2, 3, -1
MARIAN_EOS, MARIAN_UNK = 0, 1
EOS_LOGIT_BIAS = -1e4  # the converted model's: random logits are within a few units of 0
BEAM = 4
ALPHA = 0.6
SEARCHES = {"greedy": 1, "beam 4": BEAM}  # search -> beam size
PEERS = ["keras-hub", "transformers", "ctranslate2", "recomputed"]


def named(system, search):
    """A contender's name: "ours", "ours int8, beam 4", ..."""
    return system + (", beam 4" if search == "beam 4" else "")


def random_sources(rng, batch_size, source_length, vocabulary_size):
    """int32 `[batch_size, source_length + 1]`: random word ids, then EOS."""
    words = rng.integers(4, vocabulary_size, (batch_size, source_length))
    return np.concatenate([words, np.full((batch_size, 1), EOS)], axis=1).astype("int32")


# Each contender is `prepare(source_ids) -> decode`: `prepare` turns the
# sentences into the system's own inputs, untimed, and `decode()` decodes
# them and returns each output's length, which the warm-up call checks.


def ours(model, beam_size, output_length, source_length, jit_compile, bos_id=BOS, length_penalty="gnmt",
         model_ids=None):
    """`source_length` counts the source's EOS; outputs may reach
    `source_length + max_extra_length` positions. `model_ids` maps the
    shared sources to the model's ids (a converted model's), if given."""

    def search(source, limit, decoding):
        return search_translations(
            model, source, limit, beam_size=beam_size, alpha=ALPHA,
            max_extra_length=output_length - source_length,
            bos_id=bos_id, eos_id=NEVER, length_penalty=length_penalty, decoding=decoding,
        )

    compiled = CompiledFunction(search, model, [2, 1], jit_compile=jit_compile)

    def prepare(source_ids):
        if model_ids is not None:
            source_ids = model_ids(source_ids)
        limits = np.full((len(source_ids),), output_length, "int32")

        def decode():
            ids, _ = compiled(source_ids, limits)
            return list(np.count_nonzero(ids[:, 0], axis=1))

        return decode

    return prepare


def recomputed(model, beam_size, output_length, jit_compile):
    """Our beam search (greedy for a beam of 1) whose step runs the whole
    decoder over the target buffer, the newest position's logits taken."""

    def search(source_ids, decoding):
        encoder_output, encoder_padding_mask = model.encode(source_ids, decoding=decoding)
        encoder_output = ops.repeat(encoder_output, beam_size, axis=0)
        encoder_padding_mask = ops.repeat(encoder_padding_mask, beam_size, axis=0)

        def step_fn(ids, index, state):
            x = model._decode(ids[:, :output_length], encoder_output, encoder_padding_mask, training=False,
                              decoding=decoding)
            x = ops.slice(x, [0, index, 0], [ops.shape(x)[0], 1, model.d_model])
            return model._logits(x, decoding)[:, 0], state

        batch_size = ops.shape(source_ids)[0]
        return beam_search(
            step_fn, ops.full((batch_size,), BOS, dtype="int32"), ops.zeros((batch_size, 1)),
            beam_size=beam_size, alpha=ALPHA, max_length=output_length, eos_id=NEVER, decoding=decoding,
        )

    compiled = CompiledFunction(search, model, [2], jit_compile=jit_compile)

    def prepare(source_ids):
        return lambda: list(np.count_nonzero(compiled(source_ids)[0][:, 0], axis=1))

    return prepare


# keras-hub ------------------------------------------------------------------------


class KerasHubDecoder(keras.layers.Layer):
    """Embedding, sine positions and `TransformerDecoder`s from keras-hub."""

    def __init__(self, vocabulary_size, num_layers, d_model, d_ff, num_heads, **kwargs):
        import keras_hub

        super().__init__(**kwargs)
        self.d_model = d_model
        self.embedding = keras_hub.layers.ReversibleEmbedding(vocabulary_size, d_model)
        self.position_encoding = keras_hub.layers.SinePositionEncoding()
        self.decoders = [keras_hub.layers.TransformerDecoder(d_ff, num_heads, dropout=0.1) for _ in range(num_layers)]

    def build(self, encoder_output_shape):
        self.embedding.build((None, None))
        for decoder in self.decoders:
            decoder.build((None, None, self.d_model), encoder_output_shape)
        self.built = True

    def cross_attention_cache(self, encoder_output):
        """Keys and values of the encoder output per layer: [B, L, 2, S, N, H]."""
        caches = []
        for decoder in self.decoders:
            attention = decoder._cross_attention_layer
            keys_values = [attention._key_dense(encoder_output), attention._value_dense(encoder_output)]
            caches.append(ops.stack(keys_values, axis=1))
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
                x, x, self_attention_cache=self_cache[:, i], self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache[:, i], cross_attention_cache_update_index=None,
            )
            updated.append(layer_cache)
        return self.embedding(x, reverse=True)[:, 0], ops.stack(updated, axis=1)


class Weights(keras.layers.Layer):
    """The weights of several layers as one, for `CompiledFunction`
    (`jax.jit` takes every variable a function reads as an input)."""

    def __init__(self, *layers):
        super().__init__()
        self.parts = list(layers)


def keras_hub_search(model, hub_decoder, source_ids, max_length, sampler):
    """`sampler` (a keras-hub `GreedySampler` or `BeamSampler`) over the
    cached keras-hub decoder, from BOS to `max_length` tokens."""
    encoder_output, _ = model.encode(source_ids)
    batch_size = ops.shape(source_ids)[0]
    head_dim = model.d_model // model.num_heads
    self_cache = ops.zeros((batch_size, model.num_layers, 2, max_length + 1, model.num_heads, head_dim))
    cross_cache = hub_decoder.cross_attention_cache(encoder_output)
    prompt = ops.concatenate(
        [ops.full((batch_size, 1), BOS, dtype="int32"), ops.zeros((batch_size, max_length), dtype="int32")], axis=1
    )

    def next_fn(prompt, cache, index):
        token_ids = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
        self_cache, cross_cache = cache
        logits, self_cache = hub_decoder.call_with_cache(token_ids, self_cache, cross_cache, index - 1)
        return logits, None, (self_cache, cross_cache)

    return sampler(
        next_fn, prompt, cache=(self_cache, cross_cache), index=1, mask=ops.equal(prompt, BOS),
        # Under JAX the sampler's loop maps the variables of `model` to the
        # compiled function's inputs, as keras-hub's `generate` passes its
        # model; without it the decoder's weights became constants of the
        # program, which XLA could lay out and fold ahead of time.
        model=hub_decoder,
    )


def keras_hub_contender(model, hub_decoder, sampler, output_length, jit_compile):
    compiled = CompiledFunction(
        lambda source, decoding: keras_hub_search(model, hub_decoder, source, output_length, sampler),
        Weights(model, hub_decoder), [2], jit_compile=jit_compile,
        direct_layer_calls=False,  # under torch, through `Layer.__call__`, as keras-hub runs
    )

    def prepare(source_ids):
        return lambda: list(np.count_nonzero(compiled(source_ids)[:, 1:], axis=1))

    return prepare


# transformers and CTranslate2 -----------------------------------------------------


def marian_tokens(vocabulary_size):
    """Marian's vocabulary layout: EOS first, UNK, then words, PAD last."""
    return ["</s>", "<unk>"] + [f"w{i}" for i in range(2, vocabulary_size - 1)] + ["<pad>"]


def marian_source(source_ids):
    """Our source ids (words, then EOS) as Marian's: the same words, Marian's EOS."""
    marian = source_ids.copy()
    marian[:, -1] = MARIAN_EOS
    return marian


def random_marian(config):
    """A `MarianMTModel` of the preset's size (post-LN, ReLU, sinusoids,
    scaled and shared embeddings, as ours), with transformers' random
    initialisation, on torch's GPU where there is one."""
    import torch
    import transformers

    vocabulary_size = config["vocabulary_size"]
    marian = transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=vocabulary_size, d_model=config["d_model"],
        encoder_layers=config["num_layers"], decoder_layers=config["num_layers"],
        encoder_attention_heads=config["num_heads"], decoder_attention_heads=config["num_heads"],
        encoder_ffn_dim=config["d_ff"], decoder_ffn_dim=config["d_ff"], activation_function="relu",
        max_position_embeddings=512, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, eos_token_id=MARIAN_EOS, pad_token_id=vocabulary_size - 1,
        decoder_start_token_id=vocabulary_size - 1,
    ))
    return marian.eval().to("cuda" if torch.cuda.is_available() else "cpu")


def transformers_contender(marian, beam_size, output_length):
    """`generate` on the model's device; `decode()` reads the output back,
    which waits for the device."""
    import torch

    device = next(marian.parameters()).device

    def prepare(source_ids):
        input_ids = torch.from_numpy(marian_source(source_ids)).long().to(device)

        def decode():
            with torch.inference_mode():
                output = marian.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), num_beams=beam_size,
                    do_sample=False, max_new_tokens=output_length, min_new_tokens=output_length,
                    **({"length_penalty": ALPHA} if beam_size > 1 else {}),
                )
            # The first position is the decoder's start token.
            return list(np.count_nonzero(output[:, 1:].cpu().numpy() != marian.config.pad_token_id, axis=1))

        return decode

    return prepare


class _Vocabulary:
    """What CTranslate2's Marian loader reads of a tokenizer."""

    def __init__(self, tokens):
        self.tokens = tokens
        self.eos_token = tokens[MARIAN_EOS]
        self.unk_token = tokens[MARIAN_UNK]

    def get_vocab(self):
        return {token: i for i, token in enumerate(self.tokens)}


def converted_to_ctranslate2(marian, directory, quantization):
    """The Marian model converted by CTranslate2's transformers converter."""
    import ctranslate2

    vocabulary = _Vocabulary(marian_tokens(marian.config.vocab_size))

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return vocabulary  # random weights: there is no tokenizer to load

    hf_directory = os.path.join(directory, "transformers")
    if not os.path.exists(hf_directory):  # saved once per model, for both precisions
        marian.save_pretrained(hf_directory)
    output = os.path.join(directory, f"ctranslate2_{quantization}")
    if not os.path.exists(output):  # converted once, for the batches and the latency alike
        Converter(hf_directory).convert(output, quantization=quantization)
    return output, vocabulary.tokens


def ctranslate2_models(marian, directory, processes, args):
    """{precision: (key, tokens)}: each precision's model, loaded in its
    process; `key` names the process, `tokens` are the ids' strings."""
    found = {}
    for precision in args.precisions:
        model_directory, tokens = converted_to_ctranslate2(marian, directory, precision)
        key = (model_directory, precision)
        processes.ask(key, "load", key, model_directory, precision, args.threads)
        found[precision] = (key, tokens)
    return found


def ctranslate2_contenders(marian, directory, processes, args, found):
    """CTranslate2's contenders, one per precision and search, into `found`."""
    for precision, (key, tokens) in ctranslate2_models(marian, directory, processes, args).items():
        for search, beam_size in SEARCHES.items():

            def prepare(source_ids, key=key, tokens=tokens, beam_size=beam_size):
                batch = [[tokens[i] for i in row] for row in marian_source(source_ids)]
                return lambda: processes.ask(key, "decode", key, batch, beam_size, args.output_length, ALPHA)

            found[named(f"ctranslate2 {precision}", search)] = (search, precision, prepare)


# the contenders --------------------------------------------------------------------


def ours_precisions(model, args):
    """{precision: (system, model)}: ours in float32, and int8 if asked for."""
    found = {"float32": ("ours", model)}
    if "int8" in args.precisions:
        found["int8"] = ("ours int8", kt.models.quantized(model, "int8"))
    return found


def contenders(preset, config, args, directory, processes):
    """{name: (search, precision, prepare)} for `preset` with `config`."""
    model = kt.build_transformer(preset, vocabulary_size=args.vocabulary_size)
    length, xla, source_length = args.output_length, args.jit_compile, args.source_length + 1
    ours_models = ours_precisions(model, args)
    if "keras-hub" in args.peers:
        import keras_hub

        hub_decoder = KerasHubDecoder(
            args.vocabulary_size, config["num_layers"], config["d_model"], config["d_ff"], config["num_heads"]
        )
        hub_decoder.build((None, None, config["d_model"]))
        samplers = {"greedy": keras_hub.samplers.GreedySampler(), "beam 4": keras_hub.samplers.BeamSampler(num_beams=BEAM)}
    if "transformers" in args.peers or "ctranslate2" in args.peers:
        marian = random_marian(config)
    found = {}
    for search, beam_size in SEARCHES.items():
        for precision, (system, weights) in ours_models.items():
            found[named(system, search)] = (search, precision, ours(weights, beam_size, length, source_length, xla))
        if "recomputed" in args.peers:
            found[named("ours recomputed", search)] = (search, "float32", recomputed(model, beam_size, length, xla))
        if "keras-hub" in args.peers:
            found["keras-hub " + type(samplers[search]).__name__] = (
                search, "float32", keras_hub_contender(model, hub_decoder, samplers[search], length, xla)
            )
        if "transformers" in args.peers:
            found[named("transformers generate", search)] = (
                search, "float32", transformers_contender(marian, beam_size, length)
            )
    if "ctranslate2" in args.peers:
        ctranslate2_contenders(marian, directory, processes, args, found)
    return found


# opus-mt-en-de's config.json, but for its weights; "tiny" for a smoke run.
OPUS_MT_EN_DE = {
    "vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
    "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "activation_function": "swish",
    "max_position_embeddings": 512, "scale_embedding": True, "share_encoder_decoder_embeddings": True,
    "pad_token_id": 58100, "decoder_start_token_id": 58100, "eos_token_id": 0,
}
CONVERTED_SIZES = {
    "opus-mt-en-de": OPUS_MT_EN_DE,
    "tiny": OPUS_MT_EN_DE | {
        "vocab_size": 500, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "pad_token_id": 499,
        "decoder_start_token_id": 499,
    },
}


def random_opus_mt(directory, size):
    """A random `MarianMTModel` of `size`, saved with a tokenizer that names
    its ids (SentencePiece models of a few pieces: the tool feeds ids, not
    text)."""
    import io

    import sentencepiece
    import torch
    import transformers

    model = transformers.MarianMTModel(transformers.MarianConfig(**size)).eval()
    with torch.no_grad():
        # EOS can't win, in any engine: the latency's `Translator`, which
        # has no ban on EOS, decodes to its length limit as the peers do.
        model.final_logits_bias[0, size["eos_token_id"]] = EOS_LOGIT_BIAS
    model.save_pretrained(directory)
    with open(os.path.join(directory, "vocab.json"), "w") as file:
        json.dump({token: i for i, token in enumerate(marian_tokens(size["vocab_size"]))}, file)
    pieces = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["w2 w3 w4 w5 w6 w7 w8 w9"] * 20), model_writer=pieces, vocab_size=14, minloglevel=2,
    )
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(directory, name), "wb") as file:
            file.write(pieces.getvalue())
    return model


def converted_models(size, args, directory):
    """`--converted`'s random OPUS-MT model: `(marian, translator,
    ours_models)`, the `MarianMTModel`, ours converted from it, and
    `ours_precisions` of the translator's model."""
    from keras_transformer.convert import convert

    marian = random_opus_mt(os.path.join(directory, "transformers"), size)
    translator = convert(os.path.join(directory, "transformers"), os.path.join(directory, "ours"))
    return marian, translator, ours_precisions(translator.model, args)


def converted_contenders(marian, translator, ours_models, args, directory, processes):
    """`--converted`: ours, transformers and CTranslate2 on the same random
    OPUS-MT weights; {name: (search, precision, prepare)}."""

    def model_ids(source_ids):  # Marian's ids, as the peers get them, mapped to ours
        return np.array(translator.tokenizer.id_map.to_ours(marian_source(source_ids)), "int32")

    found = {}
    for search, beam_size in SEARCHES.items():
        for precision, (system, model) in ours_models.items():
            found[named(system, search)] = (search, precision, ours(
                model, beam_size, args.output_length, args.source_length + 1, args.jit_compile,
                bos_id=translator.tokenizer.bos_id, length_penalty="power", model_ids=model_ids,
            ))
        if "transformers" in args.peers:
            found[named("transformers generate", search)] = (
                search, "float32", transformers_contender(marian, beam_size, args.output_length)
            )
    if "ctranslate2" in args.peers:
        ctranslate2_contenders(marian, directory, processes, args, found)
    return found


# the benchmark ---------------------------------------------------------------------


def decoding_flops(config, batch_size, source_length, output_length, beam_size):
    """The model's multiply-adds, times 2, for one batch: the encoder, the
    cross-attention keys and values once per sentence, then each of
    `output_length` steps for every hypothesis (self-attention over the
    positions so far, cross-attention, feed-forward, output projection).
    Softmaxes, norms and the search's own work are not counted."""
    d, d_ff, layers, V = config["d_model"], config["d_ff"], config["num_layers"], config["vocabulary_size"]
    S = source_length
    encoder = layers * (S * (4 * d * d + 2 * d * d_ff) + 2 * S * S * d)
    cross_keys_values = layers * S * 2 * d * d
    steps = sum(
        layers * (6 * d * d + 2 * d * d_ff + 2 * (t + 1) * d + 2 * S * d) + d * V for t in range(output_length)
    )
    return 2 * batch_size * (encoder + cross_keys_values + beam_size * steps)


def benchmark(found, batch_size, args, config):
    # Marian's PAD is the last id: no source word takes it.
    source_ids = random_sources(
        np.random.default_rng(batch_size), batch_size, args.source_length, config["vocabulary_size"] - 1
    )
    decoders = {name: prepare(source_ids) for name, (_, _, prepare) in found.items()}
    for name, decode in decoders.items():  # warm-up: compiles (torch records at the second call), checks lengths
        decode()
        lengths = [int(length) for length in decode()]
        if lengths != [args.output_length] * batch_size:
            raise RuntimeError(f"{name} did not decode {args.output_length} tokens per sentence: {lengths}")
    seconds = {name: [] for name in found}
    for _ in range(args.rounds):
        for name, decode in decoders.items():
            time.sleep(args.settle)
            start = time.perf_counter()
            decode()
            seconds[name].append(time.perf_counter() - start)
    rows = {}
    for name, (search, precision, _) in found.items():
        median = statistics.median(seconds[name])
        flops = decoding_flops(config, batch_size, args.source_length + 1, args.output_length, SEARCHES[search])
        rows[name] = {
            "model_flops": flops, "flops_per_second": flops / median,
            "search": search, "precision": precision, "seconds_per_batch": seconds[name],
            "median_seconds": median, "sentences_per_second": batch_size / median,
        }
    for name, row in rows.items():
        if name.startswith("ours") and "recomputed" not in name:
            continue  # the reference
        mine = named("ours int8" if row["precision"] == "int8" else "ours", row["search"])
        mine = mine if mine in rows else named("ours", row["search"])  # ours has no such precision
        row["ours/this"] = rows[mine]["sentences_per_second"] / row["sentences_per_second"]
    return rows


def print_table(title, batch_size, rows):
    print(f"\n{title}, batch {batch_size}")
    print("| contender | search | precision | sentences/s | s per batch (median) | model GFLOP/s | ours / this |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for name, row in sorted(rows.items(), key=lambda item: (item[1]["search"], item[1]["precision"])):
        ratio = f"{row['ours/this']:.2f}" if "ours/this" in row else ""
        print(
            f"| {name} | {row['search']} | {row['precision']} | {row['sentences_per_second']:.1f} "
            f"| {row['median_seconds']:.3f} | {row['flops_per_second'] / 1e9:.1f} | {ratio} |",
            flush=True,
        )


# --latency -------------------------------------------------------------------------

# Multi30k's test sentences, where ../shared/data sits beside the repository.
LATENCY_SOURCE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "multi30k", "test2016.en"
)
LATENCY_WARM_UP = 3  # sentences each engine decodes untimed before the timed ones


def read_sentences(path):
    """The non-empty lines of `path`, stripped."""
    with open(path, encoding="utf-8") as file:
        return [line.strip() for line in file if line.strip()]


def latency_sources(sentences, count, vocabulary_size, longest):
    """Marian word ids of the first `count` sentences, one per subword of a
    SentencePiece model trained here on `sentences` (at most `longest`):
    real lengths; the words themselves are arbitrary, as the weights are."""
    import io

    import sentencepiece

    pieces = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=pieces, vocab_size=1000, hard_vocab_limit=False,
        input_sentence_size=100_000, shuffle_input_sentence=True, minloglevel=2,
    )
    processor = sentencepiece.SentencePieceProcessor(model_proto=pieces.getvalue())
    # Marian's words are ids 2 .. vocabulary - 2: EOS and UNK come first, PAD last.
    words = np.random.default_rng(0).permutation(np.arange(2, vocabulary_size - 1))
    return [[int(words[piece % len(words)]) for piece in ids][:longest] for ids in processor.encode(sentences[:count])]


def latency_row(precision, milliseconds):
    p50, p95, p99 = (float(p) for p in np.percentile(milliseconds, [50, 95, 99]))
    return {
        "precision": precision, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
        "mean_ms": statistics.mean(milliseconds), "max_ms": max(milliseconds),
        "total_seconds": sum(milliseconds) / 1000, "milliseconds": milliseconds,
    }


def latency(marian, translator, ours_models, args, sentences, directory, processes):
    """`--latency`: the first `args.latency` sentences, one at a time, by
    ours through a `Translator` and by CTranslate2, each decoded to its
    source's tokens + 1; the report."""
    from keras_transformer.decoding import Translator

    beam_size = args.latency_beam
    sources = latency_sources(sentences, args.latency, marian.config.vocab_size, translator.max_source_length - 2)
    lengths = [len(words) + 2 for words in sources]  # the source's words and EOS, + 1
    ours_ids = [translator.tokenizer.id_map.to_ours(words + [MARIAN_EOS]) for words in sources]
    engines, warm_up = {}, {}
    for precision, (system, model) in ours_models.items():
        # The serving path: length buckets, one program each; EOS can't win
        # (`random_opus_mt`), so a source of n tokens decodes n - 1 + 2.
        serving = Translator(
            model, translator.tokenizer, beam_size=beam_size, alpha=ALPHA, length_penalty="power",
            # Buckets up to the longest sentence here: a service warms them all, at a cost reported apart.
            max_extra_length=2, max_source_length=max(map(len, ours_ids)), jit_compile=args.jit_compile,
            quantize=None if precision == "float32" else precision,
        )
        programs, seconds = serving.warm_up([1])
        warm_up[system] = {"programs": programs, "seconds": seconds}
        print(f"{system}: warm_up([1]) ran {programs} programs in {seconds:.1f} s", flush=True)

        def decode(i, serving=serving):
            ((ids, _),) = serving.search_ids([ours_ids[i]])
            return int(np.count_nonzero(ids[0]))

        engines[system] = (precision, decode)
    if "ctranslate2" in args.peers:
        for precision, (key, tokens) in ctranslate2_models(marian, directory, processes, args).items():
            batches = [[[tokens[i] for i in words + [MARIAN_EOS]]] for words in sources]

            def decode(i, key=key, batches=batches):
                return processes.ask(key, "decode", key, batches[i], beam_size, lengths[i], ALPHA)[0]

            engines[f"ctranslate2 {precision}"] = (precision, decode)

    def turn(name, i):
        start = time.perf_counter()
        length = engines[name][1](i)
        seconds = time.perf_counter() - start
        if length != lengths[i]:
            raise RuntimeError(f"{name} decoded {length} tokens of sentence {i + 1}; expected {lengths[i]}, "
                               f"as every engine: its {lengths[i] - 1} source tokens + 1")
        return seconds

    names = list(engines)
    for name in names:  # under torch, the loops of a shape are recorded at its second call
        for i in range(min(LATENCY_WARM_UP, len(sources))):
            turn(name, i)
    # A moment's idle, not --settle: libgomp's threads (CTranslate2's,
    # torch's) stop spinning within milliseconds, and N x engines turns
    # of --settle would outlast the measurement.
    settle = min(args.settle, 0.02)
    milliseconds = {name: [] for name in names}
    for i in range(len(sources)):
        # Sentence by sentence, each engine in turn, the order rotating: the machine's noise is shared.
        for name in names[i % len(names):] + names[: i % len(names)]:
            time.sleep(settle)
            milliseconds[name].append(1000 * turn(name, i))
    rows = {name: latency_row(precision, milliseconds[name]) for name, (precision, _) in engines.items()}
    ratios = {}  # ours' milliseconds over CTranslate2's, of the same precision
    for precision, (system, _) in ours_models.items():
        if f"ctranslate2 {precision}" in rows:
            peer = rows[f"ctranslate2 {precision}"]
            ratios[precision] = {q: rows[system][f"{q}_ms"] / peer[f"{q}_ms"] for q in ("p50", "p99")}
    return {
        "sentences": len(sources), "source": os.path.abspath(args.latency_source), "beam_size": beam_size,
        "lengths": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "settle_seconds": settle, "warm_up": warm_up, "engines": rows, "ours/ctranslate2": ratios,
    }


def print_latency(title, report):
    lengths = report["lengths"]
    print(f"\n{title}, latency: {report['sentences']} sentences one at a time, beam {report['beam_size']}, "
          f"{lengths['min']} to {lengths['max']} output tokens (median {lengths['median']})")
    print("| engine | precision | p50 ms | p95 ms | p99 ms | mean ms | max ms | total s "
          "| ours / this, p50 ms | ours / this, p99 ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in report["engines"].items():
        ratio = report["ours/ctranslate2"].get(row["precision"]) if name.startswith("ctranslate2") else None
        ratios = f"{ratio['p50']:.2f} | {ratio['p99']:.2f}" if ratio else " | "
        print(f"| {name} | {row['precision']} | {row['p50_ms']:.1f} | {row['p95_ms']:.1f} | {row['p99_ms']:.1f} "
              f"| {row['mean_ms']:.1f} | {row['max_ms']:.1f} | {row['total_seconds']:.2f} | {ratios} |", flush=True)


# --torch-paths ---------------------------------------------------------------------

# (direct calls, recorded loops, the rule's products) of each variant.
TORCH_PATHS = {
    "all": (True, True, True),
    "no direct calls": (False, True, True),
    "no recorded loops": (True, False, True),
    "other products": (True, True, False),
    "none (Keras eager)": (False, False, True),
}


def torch_paths(preset, batch_size, args):
    """{search: {variant: row}} of the torch paths' variants, at `preset`."""
    from keras_transformer.backend import loops as backend_loops

    model = kt.build_transformer(preset, vocabulary_size=args.vocabulary_size)
    source = random_sources(np.random.default_rng(0), batch_size, args.source_length, args.vocabulary_size)
    inputs = (source, np.full((batch_size,), args.output_length, "int32"))
    rows = {}
    for search, beam_size in SEARCHES.items():

        def fn(source, limit, decoding, beam_size=beam_size):
            return search_translations(
                model, source, limit, beam_size=beam_size, alpha=ALPHA,
                max_extra_length=args.output_length - source.shape[1], bos_id=BOS, eos_id=NEVER, decoding=decoding,
            )

        variants = {}
        for name, (direct, loops, rule) in TORCH_PATHS.items():
            # Compiled as a translator compiles it, its options then set.
            compiled = CompiledFunction(fn, model, [x.ndim for x in inputs])
            compiled.decoding = dataclasses.replace(
                compiled.decoding, direct=direct, loops=backend_loops.TracedLoops(model) if loops else None
            )
            context = contextlib.nullcontext if rule else other_products
            with context():
                for _ in range(2):
                    compiled(*inputs)
            variants[name] = (compiled, context)
        times = {name: [] for name in variants}
        names = list(variants)
        for turn in range(args.rounds):
            for name in names[turn % len(names):] + names[: turn % len(names)]:
                compiled, context = variants[name]
                with context():
                    start = time.perf_counter()
                    compiled(*inputs)
                    times[name].append(time.perf_counter() - start)
        # Each turn beside the same round's "all": the machine's episodes of load fall on both.
        rows[search] = {name: {
            "sentences_per_second": batch_size / statistics.median(seconds),
            "seconds": seconds,
            "over_all": statistics.median(a / b for a, b in zip(times["all"], seconds)),
        } for name, seconds in times.items()}
        for name, row in rows[search].items():
            print(f"  {preset:5s} batch {batch_size:3d} {search:7s} {name:20s} "
                  f"{row['sentences_per_second']:8.1f} sentences/s  {row['over_all']:.2f}x", flush=True)
    return rows


def run_torch_paths(args):
    import torch

    from keras_transformer import environment
    from keras_transformer.backend import products

    chosen = "oneDNN's" if products.onednn_preferred() else "torch's matmul"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, products: {chosen}; "
          f"{args.source_length} source tokens + EOS, {args.output_length} output tokens", flush=True)
    return {
        "command": " ".join(["KERAS_BACKEND=torch", "python"] + sys.argv),
        "machine_detail": environment.describe_machine(),
        "products": chosen,
        "versions": {"keras": keras.__version__, "torch": torch.__version__},
        "runs": [
            {"preset": preset, "batch_size": batch_size, "searches": torch_paths(preset, batch_size, args)}
            for preset in args.presets for batch_size in args.batch_sizes
        ],
    }


def run_engines(args, sentences=None):
    """The batch cells of `args.batch_sizes`, then `--latency` over
    `sentences` (the lines of `--latency-source`) if asked for."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # one tf.function per contender is by design
    header = {
        "command": " ".join([f"KERAS_BACKEND={backend}", "python"] + sys.argv),
        "backend": backend + (" (XLA)" if args.jit_compile and backend == "tensorflow" else ""),
        "batch_sizes": args.batch_sizes, "source_length": args.source_length,
        "output_length": args.output_length, "rounds": args.rounds, "ctranslate2_threads": args.threads,
    }
    with contextlib.suppress(ImportError):
        import torch

        header["torch_threads"] = torch.get_num_threads()
        header["torch_device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    if args.converted:
        header["model"] = CONVERTED_SIZES[args.converted]
    else:
        header["vocabulary_size"] = args.vocabulary_size
    print(json.dumps(header))
    results = dict(header, runs=[])
    processes = CTranslate2Processes()
    try:
        with tempfile.TemporaryDirectory() as directory:
            if args.converted:
                size = CONVERTED_SIZES[args.converted]
                config = {"d_model": size["d_model"], "d_ff": size["encoder_ffn_dim"],
                          "num_layers": size["encoder_layers"], "vocabulary_size": size["vocab_size"]}
                title = f"{args.converted}'s size, converted"
                marian, translator, ours_models = converted_models(size, args, directory)
                plan = [(title, config, lambda: converted_contenders(
                    marian, translator, ours_models, args, directory, processes))] if args.batch_sizes else []
            else:
                plan = []
                for preset in args.presets:
                    config = dict(kt.models.PRESETS[preset], vocabulary_size=args.vocabulary_size)
                    where = os.path.join(directory, preset)
                    plan.append((preset, config, lambda preset=preset, config=config, where=where: contenders(
                        preset, config, args, where, processes)))
            for title, config, make in plan:
                found = make()
                for batch_size in args.batch_sizes:
                    rows = benchmark(found, batch_size, args, config)
                    print_table(title, batch_size, rows)
                    results["runs"].append({"preset": title, "batch_size": batch_size, "contenders": rows})
                processes.close()  # a preset's CTranslate2 processes end with its runs
            if args.latency:
                results["latency"] = latency(marian, translator, ours_models, args, sentences, directory, processes)
                print_latency(title, results["latency"])
    finally:
        processes.close()
    return results


# `--convert-memory`'s child: convert argv[1] into argv[2], print the peak.
CONVERT_MEMORY = """
import json, sys
def status(key):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key + ":"))
import keras, safetensors
from keras_transformer.convert import convert
keras.ops.convert_to_numpy(keras.ops.ones((2, 2)) @ keras.ops.ones((2, 2)))  # the backend started, as after imports
# Keras imports TensorFlow, where it is installed, when it first serializes
# anything (under every backend): an import, of the same size for any model.
keras.saving.serialize_keras_object(keras.layers.Dense(1))
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the peak from here on: the imports' own peak is not convert's
translator = convert(sys.argv[1], sys.argv[2])
print(json.dumps({"parameters": translator.model.count_params(), "after_imports": before, "peak": status("VmHWM")}))
"""


def convert_memory(size_name):
    """`convert`'s peak resident memory above its process's after imports,
    in a child process, over the float32 size of the model."""
    import subprocess

    with tempfile.TemporaryDirectory() as directory:
        random_opus_mt(os.path.join(directory, "transformers"), CONVERTED_SIZES[size_name])
        out = subprocess.run([sys.executable, "-c", CONVERT_MEMORY, os.path.join(directory, "transformers"),
                              os.path.join(directory, "ours")], check=True, capture_output=True, text=True).stdout
    found = json.loads(out.splitlines()[-1])
    found |= {"size": size_name, "backend": keras.backend.backend(), "float32_bytes": 4 * found["parameters"]}
    found["peak_over_float32"] = (found["peak"] - found["after_imports"]) / found["float32_bytes"]
    print(f"convert, {size_name}, {found['backend']}: peak {found['peak'] / 2**20:,.0f} MiB, "
          f"{(found['peak'] - found['after_imports']) / 2**20:,.0f} above imports: "
          f"{found['peak_over_float32']:.2f}x the float32 model ({found['float32_bytes'] / 2**20:,.0f} MiB)", flush=True)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base"], choices=sorted(kt.models.PRESETS))
    parser.add_argument("--batch-sizes", nargs="+", type=int,
                        help="default: 1 32, or none with --latency (its sentences alone)")
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--output-length", type=int, default=40)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.5, help="idle seconds before each turn")
    parser.add_argument("--peers", nargs="*", default=PEERS[:3], choices=PEERS,
                        help="besides ours; recomputed only when named")
    parser.add_argument("--precisions", nargs="+", default=["float32", "int8"], choices=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2's intra_threads")
    parser.add_argument("--jit-compile", action="store_true", help="XLA under TensorFlow")
    parser.add_argument("--converted", nargs="?", const="opus-mt-en-de", choices=sorted(CONVERTED_SIZES),
                        help="a converted OPUS-MT model of this size instead of the presets, against the "
                        "transformers and ctranslate2 of --peers")
    parser.add_argument("--latency", nargs="?", type=int, const=300, metavar="N",
                        help="with --converted: N sentences (300 if no N) one at a time, ours against CTranslate2")
    parser.add_argument("--latency-beam", type=int, default=1, help="the beam size of --latency; 1 is greedy")
    parser.add_argument("--latency-source", default=LATENCY_SOURCE,
                        help="the sentences of --latency, one a line (default: Multi30k's test2016.en, "
                        "in ../shared/data)")
    parser.add_argument("--convert-memory", action="store_true",
                        help="with --converted: the peak memory of convert, over the model's float32 size")
    parser.add_argument("--torch-paths", action="store_true",
                        help="ours with each torch-only decoding path switched off in turn (KERAS_BACKEND=torch)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if "float32" not in args.precisions:
        parser.error("--precisions must include float32: ours in float32 is the reference")
    if args.output_length <= args.source_length + 1:
        parser.error("--output-length must exceed --source-length + 1 (the source's EOS)")
    if args.batch_sizes is None:
        args.batch_sizes = [] if args.latency is not None else [1, 32]
    if args.rounds < 1 or min(args.batch_sizes, default=1) < 1:
        parser.error(f"--rounds and --batch-sizes must be >= 1. Received: {args.rounds}, {args.batch_sizes}")
    if args.torch_paths and keras.backend.backend() != "torch":
        parser.error(f"--torch-paths measures the torch backend's paths; KERAS_BACKEND is {keras.backend.backend()!r}")
    sentences = None
    if args.latency is not None:
        if not args.converted:
            parser.error(f"--latency times a converted translator; add --converted. Received: --latency {args.latency}")
        if args.latency < 1 or args.latency_beam < 1:
            parser.error(f"--latency and --latency-beam must be >= 1. Received: {args.latency}, {args.latency_beam}")
        if not os.path.isfile(args.latency_source):
            parser.error(f"--latency-source {args.latency_source} is not a file; expected sentences, one a line")
        sentences = read_sentences(args.latency_source)
        if len(sentences) < args.latency:
            parser.error(f"--latency {args.latency} needs as many sentences; --latency-source "
                         f"{args.latency_source} has {len(sentences)} non-empty lines")
    keras.utils.set_random_seed(0)
    if args.convert_memory:
        if not args.converted:
            parser.error("--convert-memory measures converting an OPUS-MT-size model; add --converted")
        results = convert_memory(args.converted)
    else:
        results = run_torch_paths(args) if args.torch_paths else run_engines(args, sentences)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
