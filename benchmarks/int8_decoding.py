"""int8 against float decoding, in one run: speed, and BLEU on a test set.

    python recipes/quickstart.py                # writes runs/quickstart, with test.en and test.de
    python benchmarks/int8_decoding.py --model-dir runs/quickstart
    python benchmarks/int8_decoding.py --model-dir runs/multi30k_de_en \\
        --source multi30k/test2016.de --reference multi30k/test2016.en

Two translators load the same directory: one as saved (`float`: float32,
or the model's mixed precision policy), one with
`quantize="int8"` (Keras's int8 kernels for the attention projections and
the feed-forward layers, and the int8 token embedding that also gives the
logits; see `keras_transformer.models.quantization`). Both
translate the same source file with the same search (beam 4 and alpha 0.6
unless told otherwise), taking turns for `--rounds` rounds after a warm-up,
so that they share the machine's noise. Reported: sentences per second of
each (median round), int8 / float, and sacrebleu BLEU and chrF of each
against the references, with the BLEU change. `--json` writes the figures.

The source defaults to `test.<source language>` in the model directory, which
the quick start writes; the references to the other language's file.
"""

import argparse
import glob
import json
import os
import sys
import time

import numpy as np

import keras_transformer as kt  # noqa: F401 - settles the backend first
import keras  # noqa: E402
from keras_transformer.data.corpus import read_lines  # noqa: E402
from keras_transformer.decoding import Translator  # noqa: E402
from keras_transformer.bleu import score_translations  # noqa: E402


def default_test_files(model_dir):
    """test.xx (source) and test.yy (reference) that the quick start writes."""
    files = sorted(glob.glob(os.path.join(model_dir, "test.*")))
    languages = [os.path.splitext(f)[1][1:] for f in files]
    if languages != ["de", "en"]:
        return None, None
    return os.path.join(model_dir, "test.en"), os.path.join(model_dir, "test.de")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="written by Translator.save")
    parser.add_argument("--source", help="sentences to translate (default: MODEL_DIR/test.en)")
    parser.add_argument("--reference", help="their references (default: MODEL_DIR/test.de)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--limit", type=int, help="translate only the first LIMIT sentences")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jit-compile", action="store_true",
                        help="both translators with jit_compile=True: XLA under TensorFlow "
                        "(JAX always compiles with XLA; torch has none)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1. Received: {args.rounds}")
    source, reference = args.source, args.reference
    if source is None or reference is None:
        default_source, default_reference = default_test_files(args.model_dir)
        source, reference = source or default_source, reference or default_reference
    if source is None or reference is None:
        parser.error(f"{args.model_dir} has no test.en and test.de: give --source and --reference")
    sources, references = read_lines(source), read_lines(reference)
    if len(sources) != len(references):
        parser.error(f"{source} has {len(sources)} lines but {reference} has {len(references)}")
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]

    # Without the flag, the translator's saved setting stands.
    overrides = {"jit_compile": True} if args.jit_compile else {}
    translators = {
        precision: Translator.load(args.model_dir, beam_size=args.beam_size, quantize=quantize, **overrides)
        for precision, quantize in (("float", None), ("int8", "int8"))
    }
    outputs, seconds = {}, {precision: [] for precision in translators}
    for precision, translator in translators.items():
        start = time.perf_counter()
        translator.translate(sources)  # compiles each shape
        outputs[precision] = translator.translate(sources)  # under torch, records its loops
        print(f"{precision}: warm-up {time.perf_counter() - start:.1f} s", flush=True)
    for round_index in range(args.rounds):
        for precision, translator in translators.items():
            start = time.perf_counter()
            translated = translator.translate(sources)
            seconds[precision].append(time.perf_counter() - start)
            if translated != outputs[precision]:
                raise AssertionError(f"{precision} translated differently in round {round_index + 1}")
        print(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
            f"{p} {seconds[p][-1]:.2f} s" for p in translators), flush=True)

    report = {
        "backend": keras.backend.backend(),
        "model_dir": args.model_dir,
        "source": source,
        "sentences": len(sources),
        "beam_size": args.beam_size,
        "rounds": args.rounds,
        "float_dtype_policy": translators["float"].model.dtype_policy.name,
        "jit_compile": translators["float"].jit_compile,
    }
    for precision in translators:
        median = float(np.median(seconds[precision]))
        scores = score_translations(outputs[precision], references)
        report[precision] = {
            "seconds": median,
            "sentences_per_second": len(sources) / median,
            **{key: scores[key] for key in ("bleu", "chrf")},
        }
    report["int8/float speed"] = report["float"]["seconds"] / report["int8"]["seconds"]
    report["int8 - float BLEU"] = report["int8"]["bleu"] - report["float"]["bleu"]
    print(f"\n{report['backend']}, {len(sources)} sentences of {source}, beam {args.beam_size}, "
          f"median of {args.rounds} rounds; float is {report['float_dtype_policy']}; "
          f"jit_compile={report['jit_compile']}\n")
    print("| precision | sentences/s | BLEU | chrF |\n| --- | ---: | ---: | ---: |")
    for precision in translators:
        row = report[precision]
        print(f"| {precision} | {row['sentences_per_second']:.1f} | {row['bleu']:.2f} | {row['chrf']:.2f} |")
    print(f"\nint8 / float speed: {report['int8/float speed']:.2f}x; "
          f"BLEU change: {report['int8 - float BLEU']:+.2f}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)


if __name__ == "__main__":
    sys.exit(main())
