"""A converted OPUS-MT translator against its own engines: the same weights in
ours, transformers' `generate` and CTranslate2.

    pip install -e ".[benchmarks]"
    KERAS_BACKEND=jax python benchmarks/converted_engines.py --json benchmarks/results/converted_engines_jax.json
    python benchmarks/converted_engines.py --batch-sizes 32 --rounds 1    # TensorFlow, one cell
    python benchmarks/converted_engines.py --size tiny --batch-sizes 2 --rounds 1 --output-length 8   # a smoke run

The model has opus-mt-en-de's published size and options (6+6 layers,
d_model 512, 8 heads, feed-forward 2048, swish, vocabulary 58,101, a logits
bias, shared embeddings), with transformers' random weights: no weights can
be downloaded here. It is saved in transformers' layout and converted three
ways: by `keras_transformer.convert` (ours), by CTranslate2's own converter
(float32 and int8), and read back by transformers. The same random sources
(20 words, then EOS) are decoded to exactly `--output-length` tokens,
greedily and with beam 4, EOS banned in every engine, in turns, as
`decoding_engines.py` times them (its contenders, rounds and table).
"""

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from decoding_engines import ALPHA  # noqa: E402
from decoding_engines import SEARCHES  # noqa: E402
from decoding_engines import CTranslate2Processes  # noqa: E402
from decoding_engines import benchmark  # noqa: E402
from decoding_engines import converted_to_ctranslate2  # noqa: E402
from decoding_engines import ctranslate2_contender  # noqa: E402
from decoding_engines import named  # noqa: E402
from decoding_engines import ours  # noqa: E402
from decoding_engines import print_table  # noqa: E402
from marian_peer import marian_source  # noqa: E402
from marian_peer import marian_tokens  # noqa: E402
from marian_peer import transformers_contender  # noqa: E402

from keras_transformer.convert import convert  # noqa: E402

# opus-mt-en-de's config.json, but for its weights; "tiny" for a smoke run.
OPUS_MT_EN_DE = {
    "vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
    "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "activation_function": "swish",
    "max_position_embeddings": 512, "scale_embedding": True, "share_encoder_decoder_embeddings": True,
    "pad_token_id": 58100, "decoder_start_token_id": 58100, "eos_token_id": 0,
}
SIZES = {
    "opus-mt-en-de": OPUS_MT_EN_DE,
    "tiny": OPUS_MT_EN_DE | {
        "vocab_size": 500, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "pad_token_id": 499,
        "decoder_start_token_id": 499,
    },
}


def random_opus_mt(directory, size):
    """A random `MarianMTModel` of opus-mt-en-de's size, saved with a
    tokenizer that names its 58,101 ids (SentencePiece models of a few
    pieces: the benchmark feeds ids, not text)."""
    import io

    import sentencepiece
    import transformers

    model = transformers.MarianMTModel(transformers.MarianConfig(**size)).eval()
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="opus-mt-en-de")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--output-length", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.5, help="idle seconds before each turn")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2's intra_threads")
    parser.add_argument("--jit-compile", action="store_true", help="XLA under TensorFlow")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    size = SIZES[args.size]
    args.vocabulary_size = size["vocab_size"]  # what `benchmark` draws sources from
    import keras

    config = {
        "d_model": size["d_model"], "d_ff": size["encoder_ffn_dim"], "num_layers": size["encoder_layers"],
        "vocabulary_size": args.vocabulary_size,
    }
    results = {"backend": keras.backend.backend(), "jit_compile": args.jit_compile, "model": size, "cells": {}}
    processes = CTranslate2Processes()
    with tempfile.TemporaryDirectory() as directory:
        marian = random_opus_mt(os.path.join(directory, "transformers"), size)
        translator = convert(os.path.join(directory, "transformers"), os.path.join(directory, "ours"))

        def model_ids(source_ids):  # Marian's ids, as the peers get them, mapped to ours
            return np.array(translator.tokenizer.id_map.to_ours(marian_source(source_ids)), "int32")

        found = {}
        for search, beam_size in SEARCHES.items():
            found[named("ours", search)] = (
                search, "float32", ours(
                    translator.model, beam_size, args.output_length, args.source_length + 1, args.jit_compile,
                    bos_id=translator.tokenizer.bos_id, length_penalty="power", model_ids=model_ids,
                ),
            )
            found[named("transformers generate", search)] = (
                search, "float32", transformers_contender(marian, beam_size, args.output_length, ALPHA)
            )
        for precision in ("float32", "int8"):
            model_directory, tokens = converted_to_ctranslate2(marian, directory, precision)
            for search, beam_size in SEARCHES.items():
                found[named(f"ctranslate2 {precision}", search)] = (
                    search, precision, ctranslate2_contender(
                        processes, model_directory, tokens, precision, beam_size, args.output_length, args.threads
                    ),
                )
        try:
            for batch_size in args.batch_sizes:
                rows = benchmark(found, batch_size, args, config)
                for row in rows.values():  # ours over every peer of the search, whatever its precision
                    row["ours/this"] = rows[named("ours", row["search"])]["sentences_per_second"] / row["sentences_per_second"]
                print_table(f"{args.size}'s size, converted", batch_size, rows)
                results["cells"][f"batch {batch_size}"] = rows
        finally:
            processes.close()
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()
