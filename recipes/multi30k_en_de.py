"""Multi30k English-German (or German-English) on a CPU in under two hours.

    python recipes/multi30k_en_de.py                        # en->de, runs/multi30k_en_de
    python recipes/multi30k_en_de.py --direction de-en      # de->en, runs/multi30k_de_en
    python recipes/multi30k_en_de.py --resume               # after a crash
    python recipes/multi30k_en_de.py --smoke                # a few steps, to check the setup

A configuration of `keras_transformer.training.train_translator`, the code
behind `keras-transformer train`. It trains on `train`, validates on `val`
at each checkpoint, chooses the length penalty on `val`, and scores
`test2016` once, at the end: greedy and beam
search, the last checkpoint and the average of the last ones, with
sacreBLEU on the detokenized output. Scores, translations and the
training curve go to the model directory (`results.json`).

Why this configuration (29,000 pairs, 2 CPU cores):
- the small preset with 3 layers per stack, d_model 256: the paper's base
  model overfits 29,000 pairs and trains ~6x slower per step here;
- dropout 0.3, as for the paper's big models and small-data Transformers;
- a shared BPE vocabulary of 8,000 pieces on the raw, cased text;
- 4,096 tokens per batch (about 125 steps per epoch), warmup 2,000 steps;
- mixed_bfloat16, ~1.5x faster than float32 on an Intel Xeon's AMX units;
- the average of the last 5 checkpoints, 500 steps apart;
- beam 4, with the length penalty chosen on `val` among 0.6-1.4 after
  training (the paper chose its 0.6 on its development set).
"""

import argparse
import json
import os
import sys
import time

# Quiet unless --verbose; read when keras_transformer is imported, which
# also checks KERAS_BACKEND before Keras starts.
if "--verbose" not in sys.argv[1:]:
    os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "1")
try:
    import keras_transformer  # noqa: F401
except ImportError as error:  # an unknown backend, or one not installed
    sys.exit(f"error: {error}")

# Multi30k's task 1 text: github.com/multi30k/dataset's data/task1/raw, as it
# comes (gzipped, the test set named test_2016_flickr) or unzipped.
DATA_DIR = "multi30k"
NAMES = {"test2016": ("test2016", "test_2016_flickr")}


def data_file(data_dir, split, language):
    """`split`'s `language` side in `data_dir`, under the name and compression
    it has there (`train.en`, `train.en.gz`, `test_2016_flickr.en.gz`, ...)."""
    for name in NAMES.get(split, (split,)):
        for suffix in ("", ".gz"):
            path = os.path.join(data_dir, f"{name}.{language}{suffix}")
            if os.path.isfile(path):
                return path
    return os.path.join(data_dir, f"{split}.{language}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DATA_DIR, help="github.com/multi30k/dataset's data/task1/raw, gzipped as it comes or not: train, val and test2016 (test_2016_flickr) .en/.de (default: multi30k)")
    parser.add_argument("--direction", default="en-de", choices=["en-de", "de-en"])
    parser.add_argument("--model-dir", help="default: runs/multi30k_<direction>")
    parser.add_argument("--resume", action="store_true", help="continue the run in --model-dir")
    parser.add_argument("--train-steps", type=int, default=6000)
    parser.add_argument("--dtype", default="mixed_bfloat16", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="also show TensorFlow's, XLA's and SentencePiece's log lines")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a few pairs, to test the setup")
    parser.add_argument(
        "--report-only", action="store_true",
        help="only draw the figures and samples of a finished run (results.json)",
    )
    return parser.parse_args(argv)


def configuration(args):
    from keras_transformer.training import TrainingConfig

    source, target = args.direction.split("-")
    data = lambda split, language: data_file(args.data_dir, split, language)  # noqa: E731
    config = TrainingConfig(
        model_dir=args.model_dir or os.path.join("runs", f"multi30k_{source}_{target}"),
        train_source=[data("train", source)],
        train_target=[data("train", target)],
        valid_source=[data("val", source)],
        valid_target=[data("val", target)],
        vocabulary_size=8000,
        preset="small",
        model={"num_layers": 3, "d_model": 256, "d_ff": 1024, "num_heads": 4, "dropout": 0.3},
        dtype=args.dtype,
        tokens_per_batch=4096,
        max_tokens=128,
        warmup_steps=2000,
        train_steps=args.train_steps,
        checkpoint_every=500,
        average=5,
        valid_bleu_sentences=None,
        valid_beam_size=1,  # greedy at each checkpoint: beam 4 over val would take minutes on a CPU
        beam_size=4,
        alpha=1.4,  # chosen on val (docs/results.md); tuned again after training
        seed=args.seed,
    )
    if args.smoke:
        config.vocabulary_size = 1000
        config.model = {"num_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2, "dropout": 0.3}
        config.tokens_per_batch = 512
        config.train_steps = min(args.train_steps, 4)
        config.checkpoint_every = 2
        config.average = 2
        config.warmup_steps = 10
        config.valid_bleu_sentences = 8
        config.valid_pairs = 16  # few validation shapes for jax.jit to compile
        config.log_every = 2
    return config


# Length penalties tried on `val` for the saved translator (section 6.1
# chose alpha on its development set).
ALPHAS = (0.6, 0.8, 1.0, 1.2, 1.4)


def tune_on_validation(config, log):
    """The saved translator's alpha, chosen on `val` (beam `config.beam_size`)
    and saved with it; test2016 plays no part. Returns the alpha and the
    scores of each."""
    from keras_transformer.data import read_parallel_text
    from keras_transformer.decoding import Translator
    from keras_transformer.bleu import tune_search

    translator = Translator.load(config.model_dir)
    valid = read_parallel_text(config.valid_source[0], config.valid_target[0])
    if config.valid_pairs:
        valid = valid[: config.valid_pairs]
    alphas = ALPHAS[::2] if config.valid_pairs else ALPHAS  # --smoke: fewer
    best, results = tune_search(
        translator, list(valid.sources), list(valid.targets), alphas, log=lambda line: log(f"val, {line}")
    )
    translator.with_search(alpha=best["alpha"]).save_settings(config.model_dir)
    log(f"val: alpha {best['alpha']} is the best; saved with the translator")
    return best["alpha"], results


def evaluate_test(config, alpha, test_sources, test_references, log):
    """test2016 scores: greedy and beam (at the `alpha` chosen on `val`),
    last checkpoint and averaged model."""
    import keras

    from keras_transformer.data import SubwordTokenizer
    from keras_transformer.decoding import Translator
    from keras_transformer.bleu import score_translations
    from keras_transformer.training import list_checkpoints

    tokenizer = SubwordTokenizer.load(config.model_dir)
    models = {
        "last checkpoint": keras.saving.load_model(
            list_checkpoints(os.path.join(config.model_dir, "checkpoints"))[-1], compile=False
        ),
        f"average of last {config.average}": Translator.load(config.model_dir).model,
    }
    results = []
    for name, model in models.items():
        for beam_size in (1, config.beam_size):
            translator = Translator(
                model, tokenizer, beam_size=beam_size, alpha=alpha,
                max_source_length=config.max_tokens, max_extra_length=config.max_extra_length,
            )
            start = time.time()
            hypotheses = translator.translate(test_sources)
            seconds = time.time() - start
            search = "greedy" if beam_size == 1 else f"beam {beam_size}, alpha {alpha}"
            result = {"model": name, "search": search, "seconds": round(seconds, 1)}
            result |= score_translations(hypotheses, test_references)
            results.append(result)
            log(f"test2016, {name}, {search}: BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f} "
                f"({len(hypotheses)} sentences in {seconds:.0f}s)")
            if beam_size == config.beam_size and name.startswith("average"):
                path = os.path.join(config.model_dir, "test2016.hyp")
                with open(path, "w", encoding="utf-8") as file:
                    file.write("".join(line + "\n" for line in hypotheses))
    return results


def write_report(config, test, log):
    """The training curve, a cross-attention heatmap and ten samples.

    Writes `training_curve.png`, `attention.png` and `samples.md` into the
    model directory, from `history.jsonl` and `test2016.hyp`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_transformer.decoding import Translator
    from keras_transformer.decoding import plot_cross_attention
    from keras_transformer.training.progress import read_history
    from keras_transformer.training.config import HISTORY_FILE

    history = read_history(os.path.join(config.model_dir, HISTORY_FILE))
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, key, label in (
        (axes[0], "step", "training step"),
        (axes[1], "minutes", "training time (minutes; validation BLEU excluded)"),
    ):
        x = [r["step"] if key == "step" else r["train_seconds"] / 60 for r in history]
        axis.plot(x, [r.get("loss") for r in history], "o-", label="training loss (label-smoothed)")
        axis.plot(x, [r.get("val_loss") for r in history], "s-", label="validation loss (label-smoothed)")
        axis.set_xlabel(label)
        axis.grid(alpha=0.3)
        bleu_axis = axis.twinx()
        bleu_axis.plot(x, [r.get("val_bleu") for r in history], "^-", color="tab:green", label="validation BLEU (greedy)")
        bleu_axis.set_ylim(0, 50)
        if axis is axes[1]:
            bleu_axis.set_ylabel("validation BLEU (greedy, sacreBLEU)")
        else:
            axis.set_ylabel("loss")
            lines = axis.get_lines() + bleu_axis.get_lines()
            axis.legend(lines, [line.get_label() for line in lines], loc="center right")
    figure.suptitle(f"Multi30k {os.path.basename(config.train_source[0]).split('.')[-1]} -> "
                    f"{os.path.basename(config.train_target[0]).split('.')[-1]}: {config.model_dir}")
    figure.tight_layout()
    curve = os.path.join(config.model_dir, "training_curve.png")
    figure.savefig(curve, dpi=100)
    plt.close(figure)

    translator = Translator.load(config.model_dir)
    heatmap = os.path.join(config.model_dir, "attention.png")
    translation = plot_cross_attention(translator, test.sources[0], heatmap)
    hypotheses_path = os.path.join(config.model_dir, "test2016.hyp")
    with open(hypotheses_path, encoding="utf-8") as file:
        hypotheses = file.read().splitlines()
    lines = ["| # | source | reference | ours (averaged, beam 4) |", "| --- | --- | --- | --- |"]
    for index in range(min(10, len(hypotheses))):
        cells = (test.sources[index], test.targets[index], hypotheses[index])
        lines.append(f"| {index + 1} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    with open(os.path.join(config.model_dir, "samples.md"), "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
    log(f"wrote {curve}, {heatmap} ({test.sources[0]!r} -> {translation!r}) and samples.md")


def main(argv=None):
    args = parse_args(argv)
    from keras_transformer.data import read_parallel_text
    from keras_transformer.training import train_translator
    from keras_transformer.training.progress import read_history
    from keras_transformer.training.config import HISTORY_FILE

    def log(line):
        print(line, flush=True)

    config = configuration(args)
    source, target = args.direction.split("-")
    test_files = [data_file(args.data_dir, "test2016", language) for language in (source, target)]
    missing = [path for path in config.train_source + config.train_target + config.valid_source
               + config.valid_target + test_files if not os.path.isfile(path)]
    if missing:
        sys.exit(f"error: no Multi30k in {args.data_dir}: {missing[0]} is missing; expected train, val and "
                 f"test2016 .en/.de (github.com/multi30k/dataset's data/task1/raw, gzipped or not), or pass --data-dir.")
    try:
        test = read_parallel_text(*test_files)
    except ValueError as error:  # present but unreadable
        sys.exit(f"error: {error}")
    if args.smoke:
        test = test[:8]
    if args.report_only:
        write_report(config, test, log)
        return
    start = time.time()
    try:
        train_translator(config, resume=args.resume, log=log)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    train_minutes = (time.time() - start) / 60
    alpha, tuning = tune_on_validation(config, log)
    results = evaluate_test(config, alpha, list(test.sources), list(test.targets), log)
    history = read_history(os.path.join(config.model_dir, HISTORY_FILE))
    summary = {
        "direction": args.direction,
        "config": config.to_dict(),
        "train_seconds": history[-1]["train_seconds"] if history else None,
        "this_invocation_minutes": round(train_minutes, 1),
        "val_alpha_tuning": tuning,
        "test2016": results,
    }
    with open(os.path.join(config.model_dir, "results.json"), "w") as file:
        json.dump(summary, file, indent=2)
    write_report(config, test, log)
    best = max(results, key=lambda r: r["bleu"])
    log(f"best on test2016: BLEU {best['bleu']:.2f} ({best['model']}, {best['search']}); "
        f"signature {best['bleu_signature']}")
    log(f"results in {os.path.join(config.model_dir, 'results.json')}; export with\n"
        f"  keras-transformer export --model-dir {config.model_dir} --name multi30k_{source}_{target}")


if __name__ == "__main__":
    main()
