"""`keras-transformer train`'s options, the configuration they describe,
and the command itself."""

import argparse
import dataclasses
import os

from keras_transformer.models.config import ModelConfig


def add_arguments(parser):
    from keras_transformer.training.config import TrainingConfig
    from keras_transformer.training.validation import VALID_METRICS

    defaults = TrainingConfig(model_dir="", train_source=[], train_target=[],
                              valid_source=[], valid_target=[])
    files = parser.add_argument_group("data")
    for name, help_text in (
        ("train-source", "training source text, one sentence per line (plain or .gz)"),
        ("train-target", "training target text, aligned with --train-source"),
        ("valid-source", "validation source text (loss and BLEU at each checkpoint)"),
        ("valid-target", "validation target text"),
    ):
        files.add_argument(f"--{name}", nargs="+", metavar="FILE", help=help_text + "; several files are read in turn")
    files.add_argument("--source-language", metavar="CODE", help="the source language's code, saved with the translator for `serve` (default: --train-source's suffix, such as en for train.en)")
    files.add_argument("--target-language", metavar="CODE", help="the target language's code (default: --train-target's suffix)")
    files.add_argument("--valid-fraction", type=float, help="instead of --valid-source/--valid-target: hold out this fraction of the training pairs (the same ones each time)")
    files.add_argument("--train-data", metavar="DIR", help="a dataset written by `prepare`, in place of --train-source and --train-target")
    files.add_argument("--model-dir", help="where checkpoints, logs and the trained translator go")
    files.add_argument("--config", help="a JSON object of some or all training fields, such as a run's train_config.json (options override it)")
    files.add_argument("--resume", action="store_true", help="continue the run in --model-dir from its train_config.json")
    files.add_argument("--vocabulary", help="reuse the subword.model in this directory")
    files.add_argument("--init-from", metavar="DIR", help="fine-tune this translator (trained, or made by `convert`): its model and vocabulary")
    files.add_argument("--vocabulary-size", type=int, help=f"pieces of a new shared vocabulary (default {defaults.vocabulary_size})")
    files.add_argument("--max-tokens", type=int, help=f"longest training sequence in subword tokens (default {defaults.max_tokens})")
    model = parser.add_argument_group("model")
    model.add_argument("--preset", help=f"a preset of build_transformer (default {defaults.preset})")
    for name, help_text, field in ModelConfig.flags():
        flag = "--" + name.replace("_", "-")
        if field.get("boolean"):
            model.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif field.get("choices"):
            model.add_argument(flag, choices=field["choices"], help=help_text)
        else:
            model.add_argument(flag, type=int if field["least"] is not None else float, help=help_text)
    model.add_argument("--dtype", choices=["float32", "mixed_bfloat16", "mixed_float16"], help="precision (default float32)")
    optimization = parser.add_argument_group("training")
    optimization.add_argument("--tokens-per-batch", type=int, help=f"padded tokens per side per batch (default {defaults.tokens_per_batch})")
    optimization.add_argument("--bucket-step", type=float, help=f"each batch length about this factor above the last; 1.5 compiles fewer shapes on a GPU (default {defaults.bucket_step})")
    optimization.add_argument("--buckets", type=int, help="at most N batch lengths, fitted to the corpus for the least padding (replaces --bucket-step; 8 suits a GPU)")
    optimization.add_argument("--train-steps", type=int, help=f"optimizer updates (default {defaults.train_steps})")
    optimization.add_argument("--accumulate", type=int, metavar="N", help="batches per update: their gradients summed and normalized by all their target tokens, as one batch of their sentences (default 1)")
    optimization.add_argument("--warmup-steps", type=int, help=f"learning-rate warmup (default {defaults.warmup_steps})")
    optimization.add_argument("--learning-rate-scale", type=float, help="constant factor on the schedule (default 1)")
    optimization.add_argument("--label-smoothing", type=float, help=f"eps_ls (default {defaults.label_smoothing})")
    optimization.add_argument("--max-epochs", type=int, metavar="E", help="stop after E passes over the training pairs, if before --train-steps")
    optimization.add_argument("--max-time", metavar="DURATION", help="stop after this long (90m, 2h30m, seconds) with a checkpoint; --resume goes on as long again")
    optimization.add_argument("--ema", type=float, metavar="DECAY", help="keep a moving average of the weights (decay per update, such as 0.9999), saved as the translator where it validates better")
    optimization.add_argument("--subword-alpha", type=float, metavar="A", help="subword regularization: each training sentence segmented anew at random (BPE: each merge left out with probability A)")
    optimization.add_argument("--clip-norm", type=float, metavar="NORM", help="scale each update's gradients down to this global norm where larger")
    optimization.add_argument("--checkpoint-every", type=int, help=f"steps between checkpoints (default {defaults.checkpoint_every})")
    optimization.add_argument("--average", type=int, help="last checkpoints averaged into the final model (default 5; not with --best-metric)")
    optimization.add_argument("--keep-checkpoints", type=int, help="checkpoints kept on disk, at least --average (default: --average's)")
    validation = parser.add_argument_group("validation and the choice of the model")
    validation.add_argument("--valid-bleu-sentences", type=int, help=f"validation sentences translated for BLEU and chrF at each checkpoint (default {defaults.valid_bleu_sentences})")
    validation.add_argument("--valid-metrics", nargs="+", metavar="METRIC", help=f"what each validation scores, some of {', '.join(VALID_METRICS)} (default {' '.join(defaults.valid_metrics)})")
    validation.add_argument("--valid-beam-size", type=int, help="beam of the validation's translations (default: --beam-size)")
    validation.add_argument("--valid-alpha", type=float, help="length penalty of the validation's translations (default: --alpha)")
    validation.add_argument("--best-metric", metavar="METRIC", help=f"save the best checkpoint by this validation metric as the translator, one of {', '.join(VALID_METRICS)} (lower loss and perplexity, higher BLEU and chrF are better)")
    validation.add_argument("--keep-best", type=int, metavar="K", help="best checkpoints kept in checkpoints/best/ (default: --average-best, or 1)")
    validation.add_argument("--average-best", type=int, metavar="K", help="average the K best checkpoints into the translator (default 1)")
    validation.add_argument("--patience", type=int, metavar="P", help="stop after P validations without a better --best-metric")
    validation.add_argument("--tensorboard", metavar="DIR", help="TensorBoard's event files (default: MODEL_DIR/logs)")
    optimization.add_argument("--jit-compile", choices=["auto", "true", "false"], help="XLA for the train step (default auto)")
    optimization.add_argument("--seed", type=int, help="seed of weights, dropout and data order (default 0)")
    optimization.add_argument("--log-every", type=int, help=f"a progress line every N steps (default {defaults.log_every})")
    cluster = parser.add_argument_group("several processes (docs/guide_distributed.md)")
    cluster.add_argument("--max-restarts", type=_count, default=0, metavar="N", help="JAX: start training again with "
                         "--resume up to N times when a process of the run is lost (every process's parent does the same)")
    cluster.add_argument("--heartbeat-timeout", type=_count, metavar="SECONDS", help="declare a silent process lost "
                         "after this long (JAX's heartbeats, default 100; TensorFlow's collectives)")
    search = parser.add_argument_group("search settings saved with the translator")
    search.add_argument("--beam-size", type=int, help=f"(default {defaults.beam_size})")
    search.add_argument("--alpha", type=float, help=f"length penalty (default {defaults.alpha})")
    search.add_argument("--max-extra-length", type=int, help=f"(default {defaults.max_extra_length})")


def _count(text):
    """A whole number >= 0, for argparse."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, received {text!r}")
    return int(text)


MODEL_FIELDS = tuple(name for name, _, _ in ModelConfig.flags())


def training_config(args):
    """The `TrainingConfig` the `train` arguments describe.

    With `--resume`, the model directory's own `train_config.json`; with
    `--config`, that file; options given on the command line override
    either; a run killed before it saved its configuration starts again
    from the command line, which describes it in full.
    """
    from keras_transformer.training.config import CONFIG_FILE
    from keras_transformer.training.config import TrainingConfig

    if args.resume and not args.model_dir and not args.config:
        raise ValueError("--resume needs --model-dir, the directory of the run to continue.")
    values = {}
    if args.config:
        values = TrainingConfig.read_fields(args.config)
    elif args.resume:
        saved = os.path.isfile(os.path.join(args.model_dir, CONFIG_FILE))
        if saved or not (args.train_source or args.train_data):
            values = TrainingConfig.load(args.model_dir).to_dict()
    # Every configuration field that has an option of the same name.
    for field in dataclasses.fields(TrainingConfig):
        value = getattr(args, field.name, None)
        if field.name not in ("model", "jit_compile") and value is not None:
            values[field.name] = value
    if args.jit_compile is not None:
        values["jit_compile"] = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
    overrides = {name: getattr(args, name) for name in MODEL_FIELDS if getattr(args, name) is not None}
    if overrides:
        values["model"] = dict(values.get("model") or {}) | overrides
    required = ["model_dir"]
    if not values.get("train_data"):
        required += ["train_source", "train_target"]
    if values.get("valid_fraction") is None:
        required += ["valid_source", "valid_target"]
    missing = [name for name in required if not values.get(name)]
    if missing:
        raise ValueError(
            "train needs " + ", ".join("--" + name.replace("_", "-") for name in missing)
            + " (or --config FILE, or --resume --model-dir DIR)."
        )
    for name in ("train_source", "train_target", "valid_source", "valid_target"):
        values.setdefault(name, [])
    if args.config:  # its fields' types are checked here, naming the file
        return TrainingConfig.from_dict(values, source=TrainingConfig.config_path(args.config))
    return TrainingConfig(**values)


def run(args):
    from keras_transformer.training import supervision

    config = training_config(args)
    translator = supervision.train(config, args.resume, _log, args.max_restarts, args.heartbeat_timeout)
    print(
        f"Translate with: keras-transformer translate --model-dir {config.model_dir} < input.txt\n"
        f"Export with:    keras-transformer export --model-dir {config.model_dir}"
        f"   # beam {translator.beam_size}, alpha {translator.alpha}"
    )


def _log(message):
    print(message, flush=True)
