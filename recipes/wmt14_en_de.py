"""The paper's WMT14 English-to-German setup (Vaswani et al., 2017).

    python recipes/wmt14_en_de.py --model-dir runs/wmt14-base      # TFDS, base model
    python recipes/wmt14_en_de.py --data-dir ../shared/data/wmt14 \\
        --preset tiny --train-steps 1500 --tokens-per-batch 4096 --model-dir runs/wmt14-tiny

A shared BPE vocabulary, token-based batches, Adam with the warmup/rsqrt
schedule, label smoothing 0.1, checkpoints every --checkpoint-every steps
(resumable with --resume after a crash), the average of the last checkpoints,
and sacrebleu BLEU on newstest2014. Decoding is greedy for now (the paper
used beam search with beam 4 and alpha 0.6).
"""

import argparse
import os
import sys

BACKENDS = ("tensorflow", "jax", "torch")
if os.environ.get("KERAS_BACKEND", "tensorflow") not in BACKENDS:
    sys.exit(
        f"Unknown KERAS_BACKEND={os.environ['KERAS_BACKEND']!r}. "
        f"Expected one of {', '.join(BACKENDS)}."
    )

import keras  # noqa: E402
import sacrebleu.metrics  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer import training  # noqa: E402
from keras_transformer.data import SubwordTokenizer  # noqa: E402
from keras_transformer.data import make_dataset  # noqa: E402
from keras_transformer.data import read_wmt14  # noqa: E402
from keras_transformer.decoding import Translator  # noqa: E402
from keras_transformer.models import PRESETS  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS))
    parser.add_argument("--data-dir", help="local files; TFDS when omitted")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--resume", action="store_true", help="continue the run in --model-dir")
    parser.add_argument("--train-steps", type=int, default=100000)
    parser.add_argument("--tokens-per-batch", type=int, default=25000)
    parser.add_argument("--vocabulary-size", type=int, default=37000)
    parser.add_argument("--warmup-steps", type=int, default=4000)
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--average", type=int, default=5, help="checkpoints to average (20 for big)")
    parser.add_argument("--max-length", type=int, default=100, help="words per training sentence")
    parser.add_argument("--max-tokens", type=int, default=256, help="subword tokens per sequence")
    parser.add_argument("--valid-size", type=int, help="validate on the first N pairs only")
    parser.add_argument("--test-size", type=int, help="translate only the first N test sentences")
    parser.add_argument("--beam-size", type=int, default=4, help="1 decodes greedily")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    parser.add_argument(
        "--dtype", default=None, choices=["float32", "mixed_bfloat16", "mixed_float16"],
        help="mixed precision policy; mixed_float16 adds loss scaling",
    )
    parser.add_argument(
        "--jit-compile", default="auto", choices=["auto", "true", "false"],
        help="XLA for the train step",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def prepare_model_dir(model_dir, resume):
    """Refuses to overwrite a run unless asked to resume it."""
    checkpoints = training.list_checkpoints(os.path.join(model_dir, "checkpoints"))
    if checkpoints and not resume:
        raise SystemExit(
            f"{model_dir} already holds a run ({len(checkpoints)} checkpoints, the last "
            f"{os.path.basename(checkpoints[-1])}). Pass --resume to continue it, or "
            "choose another --model-dir."
        )
    os.makedirs(model_dir, exist_ok=True)


def vocabulary(model_dir, corpus, size):
    """The run's shared vocabulary: loaded when resuming, trained otherwise."""
    if os.path.isfile(os.path.join(model_dir, "subword.model")):
        return SubwordTokenizer.load(model_dir)
    tokenizer = SubwordTokenizer.train(corpus, size)
    tokenizer.save(model_dir)
    return tokenizer


def score(hypotheses, references):
    metric = sacrebleu.metrics.BLEU()
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def main(argv=None):
    args = parse_args(argv)
    prepare_model_dir(args.model_dir, args.resume)
    keras.utils.set_random_seed(args.seed)
    distribution = training.Distribution()
    print(f"{distribution}; preset {args.preset}")

    corpora = read_wmt14(args.data_dir, max_length=args.max_length)
    for name, corpus in corpora.items():
        print(f"{name}: {corpus.summary()}")
    tokenizer = vocabulary(args.model_dir, corpora["train"], args.vocabulary_size)
    print(f"shared vocabulary: {tokenizer.vocabulary_size} tokens")

    train_data = make_dataset(
        corpora["train"], tokenizer, args.tokens_per_batch, max_length=args.max_tokens,
        repeat=True, seed=args.seed, batch_multiple=distribution.num_replicas,
    )
    valid = corpora["valid"][: args.valid_size] if args.valid_size else corpora["valid"]
    valid_data = make_dataset(
        valid, tokenizer, args.tokens_per_batch, max_length=args.max_tokens, shuffle=False
    )
    with distribution.scope():
        model = kt.build_transformer(
            args.preset, vocabulary_size=tokenizer.vocabulary_size, dtype=args.dtype
        )
        jit_compile = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
        training.compile_model(model, warmup_steps=args.warmup_steps, jit_compile=jit_compile)
    model = training.fit(
        model, train_data, args.model_dir, args.train_steps,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=max(args.average, 1),
        validation_data=valid_data, verbose=2,
    )

    checkpoints = training.list_checkpoints(os.path.join(args.model_dir, "checkpoints"))
    averaged = training.average_checkpoints(checkpoints[-args.average :])
    averaged_path = os.path.join(args.model_dir, "averaged.keras")
    averaged.save(averaged_path)
    print(f"averaged {min(args.average, len(checkpoints))} checkpoints into {averaged_path}")

    translator = Translator(
        averaged, tokenizer, beam_size=args.beam_size, alpha=args.alpha,
        max_source_length=args.max_tokens,
    )
    translator_dir = os.path.join(args.model_dir, "translator")
    translator.save(translator_dir)
    print(f"saved the translator in {translator_dir}; use it with\n"
          f"  python -m keras_transformer translate --model-dir {translator_dir} < input.en\n"
          f"or export it for TF Serving (saved_models/wmt14_en_de/<version>/) with\n"
          f"  python -m keras_transformer export --model-dir {translator_dir} --name wmt14_en_de")

    test = corpora["test"][: args.test_size] if args.test_size else corpora["test"]
    hypotheses = translator.translate(list(test.sources))
    bleu, signature = score(hypotheses, list(test.targets))
    with open(os.path.join(args.model_dir, "test_translations.de"), "w") as file:
        file.write("\n".join(hypotheses) + "\n")
    with open(os.path.join(args.model_dir, "test_bleu.txt"), "w") as file:
        file.write(f"{bleu}\n{signature}\n")
    search = "greedy" if args.beam_size == 1 else f"beam {args.beam_size}, alpha {args.alpha}"
    print(f"test ({len(test)} sentences), {search}: {bleu}")
    print(f"sacrebleu signature: {signature}")


if __name__ == "__main__":
    main()
