"""The command line: translate, score a test set, plot attention, export.

    python -m keras_transformer translate --model-dir runs/quickstart < in.en > out.de
    python -m keras_transformer evaluate --model-dir runs/quickstart \\
        --source test.en --reference test.de
    python -m keras_transformer plot-attention --model-dir runs/quickstart \\
        --text "the old man sees the dog ." --output attention.png
    python -m keras_transformer export --model-dir runs/quickstart --name quickstart

`--model-dir` is a directory written by `Translator.save` (the recipes
write one). The same commands run as `keras-transformer ...` once the
package is installed.
"""

import argparse
import os
import sys

from keras_transformer.data.corpus import decode_lines
from keras_transformer.data.corpus import read_lines


def _add_search_arguments(parser):
    parser.add_argument("--model-dir", required=True, help="written by Translator.save")
    parser.add_argument("--beam-size", type=int, help="1 searches greedily (saved default: 4)")
    parser.add_argument("--alpha", type=float, help="length penalty exponent (saved default: 0.6)")
    parser.add_argument("--batch-size", type=int, help="sentences decoded together")
    parser.add_argument("--max-extra-length", type=int, help="output tokens allowed beyond the source's")


def _load_translator(args):
    from keras_transformer.decoding import Translator

    overrides = {
        name: getattr(args, name)
        for name in ("beam_size", "alpha", "batch_size", "max_extra_length")
        if getattr(args, name) is not None
    }
    return Translator.load(args.model_dir, **overrides)


def _read_input(path):
    if path in (None, "-"):
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return read_lines(path)


def _write_lines(lines, path):
    # A translation never spans lines, so the output stays line-aligned.
    text = "".join(line.replace("\n", " ").replace("\r", " ") + "\n" for line in lines)
    if path in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)


def translate(args):
    translator = _load_translator(args)
    _write_lines(translator.translate(_read_input(args.input)), args.output)


def evaluate(args):
    import sacrebleu.metrics

    sources = read_lines(args.source)
    references = read_lines(args.reference)
    if len(sources) != len(references):
        raise SystemExit(
            f"error: {args.source} has {len(sources)} lines but "
            f"{args.reference} has {len(references)}; a test set needs one "
            "reference line per source line."
        )
    translator = _load_translator(args)
    hypotheses = translator.translate(sources)
    if args.output:
        _write_lines(hypotheses, args.output)
    search = (
        "greedy search"
        if translator.beam_size == 1
        else f"beam {translator.beam_size}, alpha {translator.alpha}"
    )
    print(f"{len(sources)} sentences of {args.source}, {search}")
    for metric in (sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()):
        score = metric.corpus_score(hypotheses, [references])
        print(score)
        print(f"  signature: {metric.get_signature()}")


def plot_attention(args):
    from keras_transformer.decoding import plot_cross_attention

    translator = _load_translator(args)
    translation = plot_cross_attention(translator, args.text, args.output, layer=args.layer)
    print(translation)
    print(f"Saved the cross-attention heatmap to {args.output}")


def export(args):
    from keras_transformer.export import export_new_version
    from keras_transformer.export import export_saved_model

    translator = _load_translator(args)
    if args.output:
        path = export_saved_model(translator, args.output)
    else:
        name = args.name or os.path.basename(os.path.normpath(args.model_dir))
        path = export_new_version(translator, name, base_dir=args.base_dir)
    print(f"Exported a SavedModel to {path} (beam {translator.beam_size}, alpha {translator.alpha})")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-transformer", description="Translate with a trained Transformer."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    command = commands.add_parser("translate", help="translate lines of text")
    _add_search_arguments(command)
    command.add_argument("--input", help="a UTF-8 text file, one sentence per line (default: stdin)")
    command.add_argument("--output", help="where to write the translations (default: stdout)")
    command.set_defaults(run=translate)

    command = commands.add_parser("evaluate", help="BLEU and chrF of a test set, with sacrebleu")
    _add_search_arguments(command)
    command.add_argument("--source", required=True, help="source sentences, one per line")
    command.add_argument("--reference", required=True, help="reference translations, aligned")
    command.add_argument("--output", help="also write the translations here")
    command.set_defaults(run=evaluate)

    command = commands.add_parser("plot-attention", help="a cross-attention heatmap as PNG")
    _add_search_arguments(command)
    command.add_argument("--text", required=True, help="the sentence to translate")
    command.add_argument("--output", required=True, help="the PNG file to write")
    command.add_argument("--layer", type=int, default=-1, help="decoder block (default: the last)")
    command.set_defaults(run=plot_attention)

    command = commands.add_parser("export", help="a SavedModel for TF Serving")
    _add_search_arguments(command)
    command.add_argument("--name", help="the model name under --base-dir (default: --model-dir's name)")
    command.add_argument(
        "--base-dir", default="saved_models", help="TF Serving's model base path (default: saved_models)"
    )
    command.add_argument("--output", help="export to exactly this directory instead of a new version")
    command.set_defaults(run=export)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError, TypeError) as error:
        raise SystemExit(f"error: {error}") from None
