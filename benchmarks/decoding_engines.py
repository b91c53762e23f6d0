"""Decoding speed against the engines people deploy: keras-hub, transformers, CTranslate2.

    pip install -e ".[benchmarks]"     # transformers and ctranslate2
    python benchmarks/decoding_engines.py --json results/engines_tensorflow.json
    python benchmarks/decoding_engines.py --jit-compile        # XLA under TensorFlow
    KERAS_BACKEND=jax python benchmarks/decoding_engines.py
    python benchmarks/decoding_engines.py --presets small --batch-sizes 32 --rounds 1

For each preset (small: 3+3 layers, d_model 256; base: 6+6, d_model 512) and
each batch size, the same random source sentences (20 tokens, then EOS) are
decoded to exactly `--output-length` tokens, greedily and with beam 4, by:

- ours: `search_translations` with the cached decoder, compiled as the
  `Translator` compiles it, in float32 and with Keras's int8 kernels and
  our int8 token embedding (`models.quantized`);
- keras-hub: its cached `GreedySampler` and `BeamSampler` driving a stack of
  keras-hub `TransformerDecoder` layers of the same size (see
  `decoding.py`), on our encoder;
- transformers: `MarianMTModel.generate` (greedy, `num_beams=4`), float32
  on torch, whatever the Keras backend;
- CTranslate2: that Marian model converted by CTranslate2's own converter,
  `translate_batch` in float32 and in int8, in a process of its own
  (`ctranslate2_worker.py`: after CTranslate2 had run in the benchmark's
  process, torch ran slower there); its turns include sending the batch
  over a pipe and receiving the lengths.

All weights are random and EOS is banned (`eos_id=-1` for ours, keras-hub
has no stop token, `min_new_tokens` for transformers, `min_decoding_length`
for CTranslate2), so every system does the same number of steps; the script
checks each output's length. The contenders take turns, one batch each per
round, for `--rounds` rounds after a warm-up call, so that the ratios share
the machine's noise; before each turn the machine idles `--settle` seconds,
so that no thread pool of the previous contender is still spinning
(CTranslate2's and torch's OpenMP threads spin for a while after their work,
and would slow whoever comes next). Reported: the median seconds per batch, sentences per
second, the model's GFLOP per second (`decoding_flops`: the same count for
every system, to set beside `matmul_peak.py`), and ours over each peer for
the same search and precision.
"""

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from marian_peer import MARIAN_EOS  # noqa: E402
from marian_peer import MARIAN_UNK  # noqa: E402
from marian_peer import marian_source  # noqa: E402
from marian_peer import marian_tokens  # noqa: E402
from marian_peer import random_marian  # noqa: E402
from marian_peer import transformers_contender  # noqa: E402
from decoding import (  # noqa: E402
    BOS,
    NEVER,
    KerasHubDecoder,
    Weights,
    keras_hub_search,
    random_sources,
)

import keras_transformer as kt  # noqa: E402
from keras_transformer.decoding import search_translations  # noqa: E402
from keras_transformer.decoding.compiled import CompiledFunction  # noqa: E402

BEAM = 4
ALPHA = 0.6
SEARCHES = {"greedy": 1, "beam 4": BEAM}  # search -> beam size


def named(system, search):
    """A contender's name: "ours", "ours int8, beam 4", ..."""
    return system + (", beam 4" if search == "beam 4" else "")


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


def keras_hub_contender(model, hub_decoder, sampler, output_length, jit_compile):
    compiled = CompiledFunction(
        lambda source, decoding: keras_hub_search(model, hub_decoder, source, output_length, sampler),
        Weights(model, hub_decoder), [2], jit_compile=jit_compile,
        direct_layer_calls=False,  # under torch, through `Layer.__call__`, as keras-hub runs
    )

    def prepare(source_ids):
        return lambda: list(np.count_nonzero(compiled(source_ids)[:, 1:], axis=1))

    return prepare


# transformers and CTranslate2 ---------------------------------------------------

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
    Converter(hf_directory).convert(output, quantization=quantization, force=True)
    return output, vocabulary.tokens


class CTranslate2Process:
    """`ctranslate2_worker.py` in a process of its own: CTranslate2 slowed
    torch in the benchmark's process (see that file). Each CTranslate2
    model gets a process of its own too (`CTranslate2Processes`)."""

    def __init__(self):
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ctranslate2_worker.py")
        self.process = subprocess.Popen([sys.executable, worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, *request):
        pickle.dump(request, self.process.stdin)
        self.process.stdin.flush()
        try:
            status, reply = pickle.load(self.process.stdout)
        except EOFError:
            raise RuntimeError(f"the CTranslate2 process ended (exit code {self.process.wait()})") from None
        if status != "ok":
            raise RuntimeError(f"CTranslate2 process: {reply}")
        return reply

    def close(self):
        self.process.stdin.close()
        self.process.wait()


class CTranslate2Processes:
    """One `CTranslate2Process` per CTranslate2 model. With a float32 and an
    int8 translator loaded in one process, the float32 one ran about half as
    fast: small, batch 32, beam 4, 0.19 s a batch alone and 0.31 s once the
    int8 one was loaded, though it was idle (benchmarks/README.md)."""

    def __init__(self):
        self.processes = {}

    def get(self, key):
        if key not in self.processes:
            self.processes[key] = CTranslate2Process()
        return self.processes[key]

    def close(self):
        for process in self.processes.values():
            process.close()
        self.processes = {}


def ctranslate2_contender(processes, model_directory, tokens, compute_type, beam_size, output_length, threads):
    key = (model_directory, compute_type)
    worker = processes.get(key)
    worker.ask("load", key, model_directory, compute_type, threads)

    def prepare(source_ids):
        batch = [[tokens[i] for i in row] for row in marian_source(source_ids)]
        return lambda: worker.ask("decode", key, batch, beam_size, output_length, ALPHA)

    return prepare


# the benchmark -------------------------------------------------------------------


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
        layers * (6 * d * d + 2 * d * d_ff + 2 * (t + 1) * d + 2 * S * d) + d * V
        for t in range(output_length)
    )
    return 2 * batch_size * (encoder + cross_keys_values + beam_size * steps)


def contenders(preset, config, args, directory, ctranslate2_processes):
    """{name: (search, precision, prepare)} for `preset` with `config`;
    CTranslate2's contenders decode in `ctranslate2_processes`, a process
    per model."""
    model = kt.build_transformer(preset, vocabulary_size=args.vocabulary_size)
    hub_decoder = KerasHubDecoder(
        args.vocabulary_size, config["num_layers"], config["d_model"], config["d_ff"], config["num_heads"]
    )
    hub_decoder.build((None, None, config["d_model"]))
    length, xla = args.output_length, args.jit_compile
    source_length = args.source_length + 1
    samplers = {
        "greedy": keras_hub.samplers.GreedySampler(),
        "beam 4": keras_hub.samplers.BeamSampler(num_beams=BEAM),
    }
    ours_models = {"float32": ("ours", model)}
    if "int8" in args.precisions:
        ours_models["int8"] = ("ours int8", kt.models.quantized(model, "int8"))
    if args.peers:
        marian = random_marian(config)
    found = {}
    for search, beam_size in SEARCHES.items():
        for precision, (system, weights) in ours_models.items():
            found[named(system, search)] = (
                search, precision, ours(weights, beam_size, length, source_length, xla)
            )
        found["keras-hub " + type(samplers[search]).__name__] = (
            search, "float32", keras_hub_contender(model, hub_decoder, samplers[search], length, xla)
        )
        if "transformers" in args.peers:
            found[named("transformers generate", search)] = (
                search, "float32", transformers_contender(marian, beam_size, length, ALPHA)
            )
    if "ctranslate2" in args.peers:
        for precision in args.precisions:
            model_directory, tokens = converted_to_ctranslate2(marian, directory, precision)
            for search, beam_size in SEARCHES.items():
                found[named(f"ctranslate2 {precision}", search)] = (
                    search, precision,
                    ctranslate2_contender(
                        ctranslate2_processes, model_directory, tokens, precision, beam_size, length, args.threads
                    ),
                )
    return found


def benchmark(found, batch_size, args, config):
    # Marian's PAD is the last id: no source word takes it.
    source_ids = random_sources(
        np.random.default_rng(batch_size), batch_size, args.source_length, args.vocabulary_size - 1
    )
    decoders = {name: prepare(source_ids) for name, (_, _, prepare) in found.items()}
    for name, decode in decoders.items():  # warm-up: compiles (torch records at the second call), checks lengths
        decode()
        lengths = [int(length) for length in decode()]
        if lengths != [args.output_length] * batch_size:
            raise RuntimeError(
                f"{name} did not decode {args.output_length} tokens per sentence: {lengths}"
            )
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
        flops = decoding_flops(
            config, batch_size, args.source_length + 1, args.output_length, SEARCHES[search]
        )
        rows[name] = {
            "model_flops": flops, "flops_per_second": flops / median,
            "search": search, "precision": precision, "seconds_per_batch": seconds[name],
            "median_seconds": median, "sentences_per_second": batch_size / median,
        }
    for name, row in rows.items():
        mine = named("ours" if row["precision"] == "float32" else "ours int8", row["search"])
        if not name.startswith("ours") and mine in rows:
            row["ours/this"] = rows[mine]["sentences_per_second"] / row["sentences_per_second"]
    return rows


def print_table(preset, batch_size, rows):
    print(f"\n{preset}, batch {batch_size}")
    print("| contender | search | precision | sentences/s | s per batch (median) | model GFLOP/s | ours / this |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for name, row in sorted(rows.items(), key=lambda item: (item[1]["search"], item[1]["precision"])):
        ratio = f"{row['ours/this']:.2f}" if "ours/this" in row else ""
        print(
            f"| {name} | {row['search']} | {row['precision']} | {row['sentences_per_second']:.1f} "
            f"| {row['median_seconds']:.3f} | {row['flops_per_second'] / 1e9:.1f} | {ratio} |",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base"], choices=sorted(kt.models.PRESETS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--output-length", type=int, default=40)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.5, help="idle seconds before each turn")
    parser.add_argument("--peers", nargs="*", default=["transformers", "ctranslate2"],
                        choices=["transformers", "ctranslate2"])
    parser.add_argument("--precisions", nargs="+", default=["float32", "int8"], choices=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2's intra_threads")
    parser.add_argument("--jit-compile", action="store_true", help="XLA under TensorFlow")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if "float32" not in args.precisions:
        parser.error("--precisions must include float32: ours in float32 is the reference")
    if args.output_length <= args.source_length + 1:
        parser.error("--output-length must exceed --source-length + 1 (the source's EOS)")
    keras.utils.set_random_seed(0)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # one tf.function per contender is by design
    import torch

    header = {
        "backend": backend + (" (XLA)" if args.jit_compile and backend == "tensorflow" else ""),
        "batch_sizes": args.batch_sizes, "source_length": args.source_length,
        "output_length": args.output_length, "vocabulary_size": args.vocabulary_size,
        "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
        "ctranslate2_threads": args.threads,
    }
    print(json.dumps(header))
    results = dict(header, runs=[])
    # A preset's CTranslate2 processes end with its runs.
    ctranslate2_processes = CTranslate2Processes()
    try:
        with tempfile.TemporaryDirectory() as directory:
            for preset in args.presets:
                config = dict(kt.models.PRESETS[preset], vocabulary_size=args.vocabulary_size)
                found = contenders(preset, config, args, os.path.join(directory, preset), ctranslate2_processes)
                for batch_size in args.batch_sizes:
                    rows = benchmark(found, batch_size, args, config)
                    print_table(preset, batch_size, rows)
                    results["runs"].append({"preset": preset, "batch_size": batch_size, "contenders": rows})
                ctranslate2_processes.close()
    finally:
        ctranslate2_processes.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
