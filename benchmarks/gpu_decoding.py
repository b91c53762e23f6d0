"""Decoding on a GPU: ours (JAX or PyTorch) against transformers' `generate`.

    KERAS_BACKEND=jax python benchmarks/gpu_decoding.py
    KERAS_BACKEND=torch python benchmarks/gpu_decoding.py --batch-sizes 1 64

The base preset (vocabulary 8,000), random weights, float32; the same
random source sentences (20 tokens, then EOS) are decoded to exactly
`--output-length` tokens by ours (`search_translations`, compiled as the
`Translator` compiles it) and by `MarianMTModel.generate` of the same size
on torch's CUDA device, greedily and with beam 4. EOS is banned on both
sides (`eos_id=-1`, `min_new_tokens`), so both do the same steps; each
output's length is checked. After a warm-up call each, the two take turns,
one batch each per round; reported: the median seconds per batch,
sentences per second, and ours over transformers. Only the CPU-side
imports differ from `decoding_engines.py`: no keras-hub, no CTranslate2.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# JAX takes 75% of the GPU when it starts; leave room for torch's peer.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from marian_peer import random_marian  # noqa: E402
from marian_peer import transformers_contender  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.decoding import search_translations  # noqa: E402
from keras_transformer.decoding.compiled import CompiledFunction  # noqa: E402

BOS, NEVER, ALPHA = 2, -1, 0.6


def ours(model, beam_size, output_length, source_length):
    def search(source, limit, decoding):
        return search_translations(
            model, source, limit, beam_size=beam_size, alpha=ALPHA,
            max_extra_length=output_length - source_length, bos_id=BOS, eos_id=NEVER, decoding=decoding,
        )  # fmt: skip

    compiled = CompiledFunction(search, model, [2, 1])

    def prepare(source_ids):
        limits = np.full((len(source_ids),), output_length, "int32")
        return lambda: list(np.count_nonzero(compiled(source_ids, limits)[0][:, 0], axis=1))

    return prepare


def timed(decode, synchronize, expected):
    start = time.perf_counter()
    lengths = decode()
    synchronize()
    seconds = time.perf_counter() - start
    if any(length != expected for length in lengths):
        raise AssertionError(f"outputs of {sorted(set(lengths))} tokens, expected {expected}")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--output-length", type=int, default=40)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    import torch

    config = kt.models.PRESETS[args.preset] | {"vocabulary_size": args.vocabulary_size}
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(args.preset, vocabulary_size=args.vocabulary_size)
    cuda = torch.cuda.is_available()  # a CPU run is the script's smoke test
    marian = random_marian(config).to("cuda" if cuda else "cpu")
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    rng = np.random.default_rng(0)
    rows = []
    device = torch.cuda.get_device_name() if cuda else "CPU"
    for batch_size in args.batch_sizes:
        source_ids = rng.integers(4, args.vocabulary_size - 2, (batch_size, args.source_length + 1)).astype("int32")
        source_ids[:, -1] = 3  # EOS
        for beam_size in (1, 4):
            contenders = {
                "ours": ours(model, beam_size, args.output_length, args.source_length + 1)(source_ids),
                "transformers": transformers_contender(marian, beam_size, args.output_length, ALPHA)(source_ids),
            }
            times = {name: [] for name in contenders}
            for name, decode in contenders.items():  # warm-up: compilation, autotuning, torch's records
                for _ in range(2):
                    timed(decode, synchronize, args.output_length)
            for _ in range(args.rounds):
                for name, decode in contenders.items():
                    times[name].append(timed(decode, synchronize, args.output_length))
            medians = {name: statistics.median(values) for name, values in times.items()}
            row = {
                "backend": keras.backend.backend(), "device": device, "preset": args.preset,
                "batch_size": batch_size, "beam_size": beam_size,
                **{f"{name}_seconds": value for name, value in medians.items()},
                "ours_over_transformers": medians["transformers"] / medians["ours"],
            }  # fmt: skip
            rows.append(row)
            print(
                f"{device}, {keras.backend.backend()}, {args.preset}, batch {batch_size}, "
                f"{'greedy' if beam_size == 1 else 'beam 4'}: ours {batch_size / medians['ours']:,.1f} "
                f"sentences/s ({medians['ours'] * 1000:.0f} ms), transformers "
                f"{batch_size / medians['transformers']:,.1f} ({medians['transformers'] * 1000:.0f} ms); "
                f"ours / transformers {row['ours_over_transformers']:.2f}x",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=2)


if __name__ == "__main__":
    main()
