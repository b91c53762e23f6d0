"""The command line: prepare data, train, translate, score given
translations, evaluate on a test set, tune the search on a validation set,
plot attention, export, serve.

    python -m keras_transformer prepare --source train.en --target train.de \
        --output data/mine --vocabulary-size 8000

    python -m keras_transformer train --train-source train.en --train-target train.de \
        --valid-source val.en --valid-target val.de --model-dir runs/mine
    python -m keras_transformer translate --model-dir runs/quickstart < in.en > out.de
    python -m keras_transformer score --model-dir runs/quickstart \\
        --source runs/quickstart/test.en --target runs/quickstart/test.de
    python -m keras_transformer evaluate --model-dir runs/quickstart \\
        --source runs/quickstart/test.en --reference runs/quickstart/test.de
    python -m keras_transformer tune --model-dir runs/quickstart \\
        --source runs/quickstart/valid.en --reference runs/quickstart/valid.de --save
    python -m keras_transformer plot-attention --model-dir runs/quickstart \\
        --text "The old man sees the dog." --output runs/attention.png
    python -m keras_transformer export --model-dir runs/quickstart --name quickstart
    python -m keras_transformer serve --model-dir runs/quickstart --port 5000

`--model-dir` is a directory written by `train` or `Translator.save` (the
recipes write one). The same commands run as `keras-transformer ...` once the
package is installed.
"""

import argparse
import functools
import os
import sys
import warnings

from keras_transformer.data.corpus import read_lines
from keras_transformer.decoding.streaming import WINDOW_LINES
from keras_transformer.files import CannotWrite
from keras_transformer.files import check_writable
from keras_transformer.files import write_atomically
from keras_transformer.serving import command as serve_command
from keras_transformer.training import command as training_command
from keras_transformer.training.command import training_config  # noqa: F401 (tests read it here)


def _add_search_arguments(parser):
    from keras_transformer.decoding import settings

    parser.add_argument("--model-dir", required=True, help="written by Translator.save")
    settings.add_arguments(parser)
    parser.add_argument("--batch-size", type=int, help="sentences decoded together")
    parser.add_argument(
        "--quantize", choices=["int8"],
        help="decode with int8 attention and feed-forward kernels and an int8 token embedding (Keras's quantization)",
    )


def _load_translator(args):
    """`--model-dir`'s translator with the command's search settings, for
    the pair of `--source-language` and `--target-language` where given."""
    from keras_transformer.decoding import Translator
    from keras_transformer.decoding import settings

    overrides = settings.from_arguments(args) | {
        name: getattr(args, name) for name in ("batch_size", "quantize") if getattr(args, name) is not None
    }
    translator = Translator.load(args.model_dir, **overrides)
    pair = getattr(args, "source_language", None), getattr(args, "target_language", None)
    return translator.with_languages(*pair) if any(pair) else translator


def _write_lines(lines, path):
    # A translation never spans lines, so the output stays line-aligned.
    text = "".join(line.replace("\n", " ").replace("\r", " ") + "\n" for line in lines)
    if path in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    elif os.path.exists(path) and not os.path.isfile(path):  # /dev/null, a pipe: not renamed over
        try:
            with open(path, "w", encoding="utf-8") as file:
                file.write(text)
        except OSError as error:
            raise CannotWrite(path, error) from None
    else:
        write_atomically(path, text)


def translate(args):
    from keras_transformer.decoding import streaming

    shard = None if args.shard is None else streaming.parse_shard(args.shard)
    if shard is not None and args.input in (None, "-"):
        raise ValueError("--shard splits a file by its line count; give it with --input, not on stdin.")
    check_writable(args.output)
    translator = _load_translator(args)
    if args.target_prefix:
        translator = translator.with_target_prefix(args.target_prefix)
    settings = _continued_with(translator, args) | ({"split_sentences": True} if args.split_sentences else {})
    lines = translator
    if args.n_best > 1 or args.with_scores or args.output_format != "text":
        from keras_transformer.decoding.output_formats import FormattedLines

        if args.split_sentences:
            raise ValueError("--split-sentences writes one translation per line; --n-best, --with-scores and "
                             "--output-format write a line's hypotheses. Give one or the other.")
        lines = FormattedLines(translator, args.n_best, args.output_format, args.with_scores)
        settings |= {"n_best": args.n_best, "output_format": args.output_format, "with_scores": args.with_scores}
    progress = streaming.Progress() if args.progress or sys.stderr.isatty() else None
    streaming.translate_file(lines, args.input, args.output, window=args.window, shard=shard, progress=progress,
                             settings=settings, split_sentences=args.split_sentences)


def _continued_with(translator, args):
    """What an interrupted output is continued with only: the translator's
    settings and this same model."""
    model_file = os.path.join(args.model_dir, "model.keras")
    return dict(translator.get_config(), model=[os.path.realpath(model_file), os.stat(model_file).st_mtime_ns])


def score(args):
    from keras_transformer.decoding import scoring
    from keras_transformer.decoding import streaming

    shard = None if args.shard is None else streaming.parse_shard(args.shard)
    pairs = streaming.PairedLines(args.source, args.target)
    check_writable(args.output)
    translator = _load_translator(args)
    settings = _continued_with(translator, args) | {"scores": "tokens" if args.token_scores else "sentences"}
    progress = streaming.Progress(done="scored", unit="pairs") if args.progress or sys.stderr.isatty() else None
    streaming.translate_file(scoring.ScoredLines(translator, args.token_scores), pairs, args.output, window=args.window,
                             shard=shard, progress=progress, settings=settings)


def _read_pairs(args, kind):
    """The `--source` and `--reference` lines: a `kind` of aligned pairs."""
    sources = read_lines(args.source)
    references = read_lines(args.reference)
    if not sources:
        raise SystemExit(f"error: {args.source} has no lines; expected a {kind}, one sentence per line.")
    if len(sources) != len(references):
        raise SystemExit(
            f"error: {args.source} has {len(sources)} lines but "
            f"{args.reference} has {len(references)}; a {kind} needs one "
            "reference line per source line."
        )
    return sources, references


def evaluate(args):
    import sacrebleu.metrics

    check_writable(args.output)
    sources, references = _read_pairs(args, "test set")
    translator = _load_translator(args)
    hypotheses = list(translator.translate_stream(sources))
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


def tune(args):
    from keras_transformer.decoding.translator import CONFIG_FILE
    from keras_transformer.bleu import tune_search

    sources, references = _read_pairs(args, "validation set")
    translator = _load_translator(args)
    print(f"{len(sources)} sentences of {args.source}")
    best, _ = tune_search(translator, sources, references, args.alphas, args.beam_sizes, log=_log)
    print(f"best: beam {best['beam_size']}, alpha {best['alpha']} (BLEU {best['bleu']:.2f})")
    if args.save:
        translator.with_search(beam_size=best["beam_size"], alpha=best["alpha"]).save_settings(args.model_dir)
        path = os.path.join(args.model_dir, CONFIG_FILE)
        print(f"saved in {path}: translate, evaluate and export now search with it")


def plot_attention(args):
    from keras_transformer.decoding import plot_cross_attention

    check_writable(args.output)
    translator = _load_translator(args)
    translation = plot_cross_attention(translator, args.text, args.output, layer=args.layer)
    print(translation)
    print(f"Saved the cross-attention heatmap to {args.output}")


def export(args):
    try:
        import tensorflow  # noqa: F401
        import tensorflow_text  # noqa: F401
    except ImportError as error:
        raise ValueError(
            f"export writes a TensorFlow SavedModel for TF Serving, which needs TensorFlow and "
            f"tensorflow-text ({error}): pip install \"keras-vaswani[export]\". A model "
            "trained under JAX or PyTorch exports as it is."
        ) from None
    from keras_transformer.export import export_new_version
    from keras_transformer.export import export_saved_model
    from keras_transformer.export.saved_model import request_bounds

    translator = _load_translator(args)
    limit, rows = request_bounds(translator, args.max_request_tokens, args.max_request_rows)
    if args.output:
        path = export_saved_model(translator, args.output, limit, rows)
    else:
        name = args.name or os.path.basename(os.path.normpath(args.model_dir))
        path = export_new_version(
            translator, name, base_dir=args.base_dir, max_request_tokens=limit, max_request_rows=rows
        )
    print(
        f"Exported a SavedModel to {path} (beam {translator.beam_size}, alpha "
        f"{translator.alpha}; a request may hold {rows} texts and cost {limit} tokens: texts x "
        f"(longest + {translator.max_extra_length}))"
    )


def prepare(args):
    from keras_transformer.data.prepared import prepare_dataset
    from keras_transformer.data.prepared import train_vocabulary
    from keras_transformer.data.tokenizer import SubwordTokenizer

    if len(args.source) != len(args.target):
        raise ValueError(f"--source and --target must name as many files; received {args.source} and {args.target}.")
    for path in args.source + args.target:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No such file: {path}.")
    if args.vocabulary:
        tokenizer = SubwordTokenizer.load(args.vocabulary)
    else:
        if args.vocabulary_size < 300:
            raise ValueError(f"--vocabulary-size must be an integer >= 300; received {args.vocabulary_size}.")
        tokenizer = train_vocabulary(args.source, args.target, args.vocabulary_size, args.seed)
        _log(f"vocabulary: trained {tokenizer.vocabulary_size} shared BPE pieces")
    prepared = prepare_dataset(args.source, args.target, tokenizer, args.output, log=_log)
    tokenizer.save(args.output)  # `train --train-data` reads the vocabulary here
    manifest = prepared.manifest
    print(
        f"Prepared {manifest['pairs']:,} pairs ({manifest['source_tokens']:,} source and "
        f"{manifest['target_tokens']:,} target tokens) in {args.output}; left out "
        f"{manifest['left_out']['empty_side']} with an empty side, {manifest['left_out']['too_long']} too long.\n"
        f"Train with:    keras-transformer train --train-data {args.output} --valid-source ... "
        "--valid-target ... --model-dir ..."
    )


def train(args):
    training_command.run(args)


def average(args):
    from keras_transformer.files import save_keras_model
    from keras_transformer.training.checkpoints import average_checkpoints

    for path in args.checkpoints:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No such checkpoint: {path}.")
    if not args.output.endswith(".keras"):
        raise ValueError(f"--output must name a .keras file; received {args.output}.")
    check_writable(args.output)
    model = average_checkpoints(args.checkpoints)
    save_keras_model(model, args.output)
    print(f"Averaged {len(args.checkpoints)} checkpoints into {args.output}")


def _show_warning(message, category, filename, lineno, file=None, line=None):
    # One line, without the source line that raised it.
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _add_language_arguments(command, default):
    for side, example in (("source", "eng_Latn, en"), ("target", "deu_Latn, de")):
        command.add_argument(f"--{side}-language", metavar="CODE", help=f"M2M-100 and NLLB-200: the {side} language, "
                             f"in the model's codes ({example}){default}")


def _log(line):
    print(line, flush=True)


def convert(args):
    from keras_transformer.convert import convert as convert_checkpoint

    translator = convert_checkpoint(args.source, args.output, args.dtype, args.source_language, args.target_language)
    model = translator.model
    _log(f"converted {args.source} into {args.output}: {model.num_layers}+{model.num_layers} blocks, d_model "
         f"{model.d_model}, {model.vocabulary_size} ids, {model.count_params():,} parameters; beam "
         f"{translator.beam_size}, alpha {translator.alpha} ({translator.length_penalty} length penalty)")


def main(argv=None):
    import keras

    from keras_transformer import __version__
    from keras_transformer.environment import BACKENDS
    from keras_transformer.environment import running_as_command

    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Train and translate with the Transformer.",
        epilog=f"The backend is KERAS_BACKEND ({', '.join(BACKENDS)}); now {keras.backend.backend()}.",
    )
    version = f"keras-transformer {__version__} (keras {keras.__version__}, backend {keras.backend.backend()})"
    parser.add_argument("--version", action="version", version=version)
    # Read by keras_transformer.environment before Keras starts; here so that
    # argparse accepts it before or after the command.
    verbose_help = "show TensorFlow's, XLA's and SentencePiece's log lines too"
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
    commands = parser.add_subparsers(dest="command", required=True)
    add_command = functools.partial(commands.add_parser, parents=[verbose])

    command = add_command("train", help="train a translator on parallel text files")
    training_command.add_arguments(command)
    command.set_defaults(run=train)

    command = add_command("prepare", help="tokenize parallel text once, for train --train-data")
    command.add_argument("--source", nargs="+", required=True, metavar="FILE", help="source text, one sentence per line (plain or .gz)")
    command.add_argument("--target", nargs="+", required=True, metavar="FILE", help="target text, aligned with --source")
    command.add_argument("--output", required=True, metavar="DIR", help="the directory to write")
    command.add_argument("--vocabulary", metavar="DIR", help="reuse the subword.model in this directory")
    command.add_argument("--vocabulary-size", type=int, default=8000, help="pieces of a new shared vocabulary (default 8000)")
    command.add_argument("--seed", type=int, default=0, help="seed of the vocabulary's sample (default 0)")
    command.set_defaults(run=prepare)

    command = add_command("average", help="average the weights of checkpoints into one model (section 6.1)")
    command.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=".keras checkpoints of one architecture")
    command.add_argument("--output", required=True, help="the .keras file to write (a run's model.keras to translate with it)")
    command.set_defaults(run=average)

    command = add_command("convert", help="a published translator (OPUS-MT, fairseq's WMT models, M2M-100, NLLB-200) "
                          "as a translator directory")
    command.add_argument("source", help="a Hugging Face model directory, a fairseq checkpoint directory, or a hub id")
    command.add_argument("--output", required=True, metavar="DIR", help="the new translator directory")
    _add_language_arguments(command, "")
    command.add_argument("--dtype", choices=["float32", "mixed_bfloat16", "mixed_float16"], help="precision (default float32)")
    command.set_defaults(run=convert)

    command = add_command("translate", help="translate lines of text")
    _add_search_arguments(command)
    command.add_argument("--input", help="a UTF-8 text file, one sentence per line (default: stdin)")
    command.add_argument(
        "--output", help="where to write the translations (default: stdout); an interrupted one is continued"
    )
    command.add_argument(
        "--window", type=int, default=WINDOW_LINES, help=f"lines read and sorted by length together (default {WINDOW_LINES})"
    )
    command.add_argument("--shard", metavar="I/N", help="translate only the I-th of N equal parts of --input (0/2, 1/2)")
    command.add_argument("--progress", action="store_true", help="lines, lines/s and time left on stderr (on a terminal: always)")
    command.add_argument("--split-sentences", action="store_true", help="translate each line sentence by sentence (a paragraph per line)")
    command.add_argument("--target-prefix", metavar="TEXT", help="the words every translation begins with; the search goes on from them")
    command.add_argument("--n-best", type=int, default=1, metavar="N",
                         help="the N best hypotheses of each line (at most the beam size), or N samples with --sampling")
    command.add_argument("--with-scores", action="store_true", help="SCORE<TAB>TRANSLATION lines (text output)")
    command.add_argument("--output-format", choices=["text", "tsv", "jsonl"], default="text",
                         help="text: N lines a source line; tsv: N lines LINE, RANK, SCORE, TRANSLATION; "
                         "jsonl: an object a source line, its alternatives in it (default: text)")
    _add_language_arguments(command, " (default: the translator's pair)")
    command.set_defaults(run=translate)

    command = add_command("score", help="the log-probability of given translations: one line of scores per pair")
    command.add_argument("--model-dir", required=True, help="written by Translator.save")
    command.add_argument("--source", required=True, help="source sentences, one per line (gzipped if .gz)")
    command.add_argument("--target", required=True, help="their translations, aligned")
    command.add_argument(
        "--output", help="where to write LOG_PROBABILITY<TAB>MEAN per pair (default: stdout); an interrupted one is continued"
    )
    command.add_argument("--token-scores", action="store_true", help="also each token's log-probability, spaced, after a tab")
    command.add_argument("--batch-size", type=int, help="pairs scored together")
    command.add_argument("--max-extra-length", type=int, help="target tokens allowed beyond the source's length limit")
    command.add_argument("--quantize", choices=["int8"], help="score with the int8 model translate --quantize int8 uses")
    command.add_argument(
        "--window", type=int, default=WINDOW_LINES, help=f"pairs read and sorted by length together (default {WINDOW_LINES})"
    )
    command.add_argument("--shard", metavar="I/N", help="score only the I-th of N equal parts of the files (0/2, 1/2)")
    command.add_argument("--progress", action="store_true", help="pairs, pairs/s and time left on stderr (on a terminal: always)")
    _add_language_arguments(command, " (default: the translator's pair)")
    command.set_defaults(run=score)

    command = add_command("evaluate", help="BLEU and chrF of a test set, with sacrebleu")
    _add_search_arguments(command)
    command.add_argument("--source", required=True, help="source sentences, one per line")
    command.add_argument("--reference", required=True, help="reference translations, aligned")
    command.add_argument("--output", help="also write the translations here")
    command.set_defaults(run=evaluate)

    command = add_command("tune", help="choose the beam size and length penalty on held-out pairs (section 6.1)")
    _add_search_arguments(command)
    command.add_argument("--source", required=True, help="held-out source sentences (validation, never the test set)")
    command.add_argument("--reference", required=True, help="their reference translations, aligned")
    command.add_argument(
        "--alphas", type=float, nargs="+", default=[0.6, 0.8, 1.0, 1.2, 1.4], metavar="ALPHA",
        help="length penalties to try (default: 0.6 0.8 1.0 1.2 1.4)",
    )
    command.add_argument("--beam-sizes", type=int, nargs="+", metavar="N", help="beam sizes to try (default: the saved one)")
    command.add_argument("--save", action="store_true", help="write the best into --model-dir's translator.json")
    command.set_defaults(run=tune)

    command = add_command("plot-attention", help="a cross-attention heatmap as PNG")
    _add_search_arguments(command)
    command.add_argument("--text", required=True, help="the sentence to translate")
    command.add_argument("--output", required=True, help="the PNG file to write")
    command.add_argument("--layer", type=int, default=-1, help="decoder block (default: the last)")
    command.set_defaults(run=plot_attention)

    command = add_command("export", help="a SavedModel for TF Serving")
    _add_search_arguments(command)
    command.add_argument("--name", help="the model name under --base-dir (default: --model-dir's name)")
    command.add_argument(
        "--base-dir", default="saved_models", help="TF Serving's model base path (default: saved_models)"
    )
    command.add_argument("--output", help="export to exactly this directory instead of a new version")
    command.add_argument(
        "--max-request-tokens", type=int,
        help="the most one request may cost: texts x (the longest text's tokens + "
        "max_extra_length) (default: what 32 texts of max_source_length tokens cost)",
    )
    command.add_argument("--max-request-rows", type=int, help="the most texts one request may hold (default: 64)")
    command.set_defaults(run=export)

    serve_command.register(add_command)

    args = parser.parse_args(argv)
    if running_as_command():
        warnings.showwarning = _show_warning
    try:
        args.run(args)
    except (ValueError, TypeError, OSError) as error:
        # OSError: files the user named (missing, unwritable, a full disk).
        raise SystemExit(f"error: {error}") from None
