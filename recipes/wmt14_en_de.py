"""The paper's WMT14 English-to-German setup (Vaswani et al., 2017).

    python recipes/wmt14_en_de.py --model-dir runs/wmt14-base      # TFDS, base model
    python recipes/wmt14_en_de.py --data-dir wmt14 \\
        --preset tiny --train-steps 1500 --tokens-per-batch 4096 --model-dir runs/wmt14-tiny

A configuration of `keras_transformer.training.train_translator`, the code
behind `keras-transformer train`: a shared BPE vocabulary, token-based
batches, Adam with the warmup/rsqrt schedule, label smoothing 0.1,
checkpoints every --checkpoint-every steps (resumable with --resume after a
crash), the average of the last checkpoints, beam search (beam 4, alpha
0.6), and sacreBLEU on newstest2014. Without --data-dir, TFDS
`wmt14_translate/de-en` is written once as text files under
`<model-dir>/data/`, which training then reads like any other files.
`--smoke` trains a tiny model for a few steps, to test a setup.

`recipes/wmt14_en_fr.py` runs this code with section 6.1's English-French
settings.
"""

import argparse
import os
import sys

# Quiet unless --verbose; read when keras_transformer is imported, which
# also checks KERAS_BACKEND before Keras starts.
if "--verbose" not in sys.argv[1:]:
    os.environ.setdefault("KERAS_TRANSFORMER_QUIET", "1")
try:
    import keras_transformer  # noqa: F401
except ImportError as error:  # an unknown backend, or one not installed
    sys.exit(f"error: {error}")


# Section 5.1: batches of about 25,000 source and 25,000 target tokens, on
# 8 P100 GPUs.
PAPER_TOKENS_PER_UPDATE = 25000
PAPER_GPUS = 8

# This recipe's defaults; wmt14_en_fr.py has its own.
EN_DE = {"preset": "base", "vocabulary_size": 37000, "dropout": None, "average": 5}


def parse_args(argv=None, defaults=EN_DE, description=__doc__):
    from keras_transformer.models import PRESETS

    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--preset", default=defaults["preset"], choices=sorted(PRESETS))
    parser.add_argument("--data-dir", help="local files; TFDS when omitted")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--resume", action="store_true", help="continue the run in --model-dir")
    parser.add_argument("--train-steps", type=int, default=100000)
    parser.add_argument("--tokens-per-update", type=int, default=PAPER_TOKENS_PER_UPDATE,
                        help="target tokens per optimizer update (section 5.1: about 25,000)")
    parser.add_argument("--tokens-per-device", type=int, default=PAPER_TOKENS_PER_UPDATE,
                        help="the most tokens a batch puts on one device, what its memory holds (default 25,000, "
                        "which an 80 GB GPU holds for the base model; the paper's 8 GPUs took 3,125 each)")
    parser.add_argument("--tokens-per-batch", type=int,
                        help="tokens per batch over all devices (default: --tokens-per-device times the devices)")
    parser.add_argument("--vocabulary-size", type=int, default=defaults["vocabulary_size"])
    parser.add_argument("--dropout", type=float, default=defaults["dropout"], help="P_drop (default: the preset's)")
    parser.add_argument("--warmup-steps", type=int, default=4000)
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--keep-checkpoints", type=int, help="checkpoints kept on disk, at least --average (default: --average's)")
    parser.add_argument("--log-every", type=int, default=100, help="a progress line every N steps")
    parser.add_argument("--buckets", type=int, help="at most N batch lengths, fitted to the corpus (8 suits a GPU)")
    parser.add_argument("--average", type=int, default=defaults["average"], help="checkpoints to average")
    parser.add_argument("--max-tokens", type=int, default=256, help="subword tokens per sequence")
    parser.add_argument("--valid-size", type=int, help="validate on the first N pairs only")
    parser.add_argument("--test-size", type=int, help="translate only the first N test sentences")
    parser.add_argument("--beam-size", type=int, default=4, help="1 decodes greedily")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "mixed_bfloat16", "mixed_float16"],
        help="mixed precision policy; mixed_float16 adds loss scaling",
    )
    parser.add_argument(
        "--jit-compile", default="auto", choices=["auto", "true", "false"],
        help="XLA for the train step",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="also show TensorFlow's, XLA's and SentencePiece's log lines")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, a few steps on a few pairs, to test the setup")
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.dropout, args.vocabulary_size = "tiny", None, min(args.vocabulary_size, 2000)
        args.train_steps, args.checkpoint_every, args.average = 2, 2, 1
        args.tokens_per_batch, args.tokens_per_update, args.max_tokens, args.warmup_steps = 2048, 4096, 64, 10
        args.valid_size, args.test_size = args.valid_size or 16, args.test_size or 8
    return args


def batches_per_update(args, devices):
    """`(tokens_per_batch, accumulate)`: a batch over every device, of at
    most `--tokens-per-device` each and at most `--tokens-per-update` in
    all, and as many batches per update as make `--tokens-per-update`."""
    tokens_per_batch = args.tokens_per_batch or min(args.tokens_per_device * devices, args.tokens_per_update)
    return tokens_per_batch, max(1, round(args.tokens_per_update / tokens_per_batch))


def configuration(args, files, devices=1):
    from keras_transformer.training import TrainingConfig

    tokens_per_batch, accumulate = batches_per_update(args, devices)

    def side(split, index):
        return [pair[index] for pair in files[split]]

    return TrainingConfig(
        model_dir=args.model_dir,
        train_source=side("train", 0), train_target=side("train", 1),
        valid_source=side("valid", 0), valid_target=side("valid", 1),
        valid_pairs=args.valid_size,
        vocabulary_size=args.vocabulary_size,
        preset=args.preset,
        model={} if args.dropout is None else {"dropout": args.dropout},
        dtype=args.dtype,
        tokens_per_batch=tokens_per_batch,
        accumulate=accumulate,
        max_tokens=args.max_tokens,
        warmup_steps=args.warmup_steps,
        train_steps=args.train_steps,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        log_every=args.log_every,
        buckets=args.buckets,
        average=args.average,
        valid_bleu_sentences=min(500, args.valid_size or 500),
        beam_size=args.beam_size,
        alpha=args.alpha,
        jit_compile={"auto": "auto", "true": True, "false": False}[args.jit_compile],
        seed=args.seed,
    )


def main(argv=None, source_language="en", target_language="de", defaults=EN_DE, description=__doc__):
    args = parse_args(argv, defaults, description)
    from keras_transformer.data.wmt14 import wmt14_files
    from keras_transformer.bleu import score_translations
    from keras_transformer.data.wmt14 import write_tfds_files
    from keras_transformer.training import train_translator
    from keras_transformer.training.distribution import training_devices
    from keras_transformer.training.run import read_corpus

    def log(line):
        print(line, flush=True)

    try:
        data_dir = args.data_dir or write_tfds_files(
            os.path.join(args.model_dir, "data"), source_language, target_language
        )
        files = wmt14_files(data_dir, source_language, target_language)
        devices = training_devices()
        config = configuration(args, files, devices)
        log(
            f"tokens per update: {config.tokens_per_batch * config.accumulate:,} = {devices} device"
            f"{'s' * (devices > 1)} x {config.tokens_per_batch // devices:,} tokens x {config.accumulate} "
            f"batch{'es' * (config.accumulate > 1)} (the paper: {PAPER_GPUS} GPUs x "
            f"{PAPER_TOKENS_PER_UPDATE // PAPER_GPUS:,} tokens x 1 batch)"
        )
        translator = train_translator(config, resume=args.resume, log=log)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    name = f"wmt14_{source_language}_{target_language}"
    log(f"use the translator with\n"
        f"  keras-transformer translate --model-dir {args.model_dir} < input.{source_language}\n"
        f"or export it for TF Serving (saved_models/{name}/<version>/) with\n"
        f"  keras-transformer export --model-dir {args.model_dir} --name {name}")

    test = read_corpus(*zip(*files["test"]), name="newstest2014")[: args.test_size]
    hypotheses = translator.translate(list(test.sources))
    scores = score_translations(hypotheses, list(test.targets))
    with open(os.path.join(args.model_dir, f"test_translations.{target_language}"), "w", encoding="utf-8") as file:
        file.write("".join(line + "\n" for line in hypotheses))
    with open(os.path.join(args.model_dir, "test_bleu.txt"), "w") as file:
        file.write(f"{scores['bleu_text']}\n{scores['bleu_signature']}\n")
    search = "greedy" if args.beam_size == 1 else f"beam {args.beam_size}, alpha {args.alpha}"
    log(f"test ({len(test)} sentences), {search}: {scores['bleu_text']}")
    log(f"sacrebleu signature: {scores['bleu_signature']}")


if __name__ == "__main__":
    main()
