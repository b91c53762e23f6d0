"""English constituency parsing with the Transformer (section 6.3), on the
Penn Treebank sample.

    python recipes/ptb_parsing.py                      # runs/ptb_parsing, docs/parsing.md
    python recipes/ptb_parsing.py --resume             # after a crash
    python recipes/ptb_parsing.py --smoke              # a few steps, to test the setup

The same model as for translation learns to map a sentence to its tree,
written as a sequence (`keras_transformer.parsing.linearize`):

    Pierre Vinken , 61 years old , will join the board ...
    ->  (S (NP (NP Pierre Vinken ) , (ADJP (NP 61 years ) old ) , ) (VP will ...

Each word is written itself (`--target-words copied`, the default), so the
decoder reads which word it has reached, and the search writes the
sentence's next word wherever the model places a word. With
`--target-words XX`, as in Vinyals et al. (2015), every word is `XX` and
the decoder must count them.

The data is the 3,914-sentence sample of the WSJ treebank that NLTK
distributes (`--data-dir`, default `ptb_wsj_sample`: files wsj_0001-0199, all from WSJ sections
00-01; the paper trained on sections 02-21, about 40,000 sentences, and
tested on section 23). The split is this project's own, by file:
wsj_0001-0159 train, wsj_0160-0179 development, wsj_0180-0199 test. Trees
lose their empty elements, function tags and indices (`parsing.clean`).

The model is smaller than the paper's (4 layers, d_model 1024) for 3,000
sentences and a CPU: 3+3 layers, d_model 256, 4 heads, d_ff 1024, P_drop
0.3, label smoothing 0.1, Adam on the warmup/rsqrt schedule, batches of
about 4,096 target tokens, the average of the last 5 checkpoints. Decoding
is the paper's: beam 21, alpha 0.3, at most the sentence's length + 300
tokens, in a search that only writes well-formed trees
(`parsing.Parser`). Scores are EVALB's labelled bracket F1
(`parsing.bracket_scores`) on the development set and, once, on the test
set, beside two baselines on the same sentences: right-branching trees and
flat trees (one S over the sentence).
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

# The WSJ files of NLTK's Penn Treebank sample (nltk_data's corpora/treebank/combined).
DATA_DIR = "ptb_wsj_sample"
REPORT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "parsing.md")
SPLITS = {"train": range(1, 160), "dev": range(160, 180), "test": range(180, 200)}
MODEL = {"num_layers": 3, "d_model": 256, "d_ff": 1024, "num_heads": 4, "dropout": 0.3}
VOCABULARY_FILE = "vocabulary.json"
# Training pairs whose tree is longer than this many tokens are left out
# (the longest sentences of the sample, a handful); every development and
# test sentence is parsed.
MAX_TRAIN_TOKENS = 320


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DATA_DIR, help="holds wsj_0001.mrg ... wsj_0199.mrg, NLTK's treebank sample (nltk_data's corpora/treebank/combined; default: ptb_wsj_sample)")
    parser.add_argument("--model-dir", default=os.path.join("runs", "ptb_parsing"))
    parser.add_argument("--report", default=REPORT_FILE, help="where the markdown report goes")
    parser.add_argument("--resume", action="store_true", help="continue the run in --model-dir")
    parser.add_argument("--train-steps", type=int, default=2000)
    parser.add_argument("--tokens-per-batch", type=int, default=4096, help="target tokens per batch, padding included")
    parser.add_argument("--warmup-steps", type=int, default=800)
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--beam-size", type=int, default=21)
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--max-extra-length", type=int, default=300)
    parser.add_argument("--target-words", choices=("copied", "XX"), default="copied",
                        help="write each word of the tree as itself (the default) or as XX (Vinyals et al.)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dev-only", action="store_true",
                        help="score the development set only, to tune without seeing the test set; no report")
    parser.add_argument("--verbose", action="store_true", help="also show TensorFlow's and XLA's log lines")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, a few steps on a few files, to test the setup")
    args = parser.parse_args(argv)
    for name in ("train_steps", "tokens_per_batch", "warmup_steps", "checkpoint_every", "beam_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1. Received: {getattr(args, name)}")
    if args.smoke:
        args.train_steps, args.checkpoint_every, args.warmup_steps = 4, 2, 2
        args.tokens_per_batch, args.beam_size, args.max_extra_length = 1024, 3, 30
    return args


def read_splits(data_dir, smoke=False):
    """Cleaned trees of each split, by file number."""
    from keras_transformer.parsing import clean
    from keras_transformer.parsing import read_treebank

    splits = {}
    for split, numbers in SPLITS.items():
        numbers = list(numbers)[:3] if smoke else numbers
        paths = [os.path.join(data_dir, f"wsj_{n:04d}.mrg") for n in numbers]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"{data_dir} lacks {len(missing)} treebank file(s) of the {split} split, such as "
                f"{os.path.basename(missing[0])}; expected wsj_0001.mrg ... wsj_0199.mrg."
            )
        trees = [clean(tree) for tree in read_treebank(paths)]
        splits[split] = [tree for tree in trees if tree is not None]
    return splits


def batches(vocabulary, trees, tokens_per_batch, seed):
    """An endless, deterministic `tf.data.Dataset` of training batches:
    pairs sorted into length buckets, each epoch shuffled anew."""
    import numpy as np
    import tensorflow as tf

    pairs = []
    for tree in trees:
        target = vocabulary.encode_tree(tree)
        if len(target) + 1 <= MAX_TRAIN_TOKENS:
            pairs.append((vocabulary.encode_sentence(tree.words()), target))

    def padded(rows, width):
        array = np.zeros((len(rows), width), "int32")
        for i, row in enumerate(rows):
            array[i, : len(row)] = row
        return array

    def epoch_batches(epoch):
        rng = np.random.default_rng(seed + epoch)
        order = rng.permutation(len(pairs))
        # Buckets of similar target length, padded to a multiple of 16.
        order = sorted(order, key=lambda i: len(pairs[i][1]) // 16)
        found, start = [], 0
        while start < len(order):
            width = -(-(len(pairs[order[start]][1]) + 1) // 16) * 16
            count = max(1, tokens_per_batch // width)
            rows = [pairs[i] for i in order[start : start + count]]
            width = -(-max(len(t) + 1 for _, t in rows) // 16) * 16
            source_width = -(-max(len(s) for s, _ in rows) // 16) * 16
            inputs = {
                "source_ids": padded([s for s, _ in rows], source_width),
                "target_ids": padded([[vocabulary.bos_id] + t for _, t in rows], width),
            }
            found.append((inputs, padded([t + [vocabulary.eos_id] for _, t in rows], width)))
            start += count
        return [found[i] for i in rng.permutation(len(found))]

    def generate():
        epoch = 0
        while True:
            yield from epoch_batches(epoch)
            epoch += 1

    spec = (
        {"source_ids": tf.TensorSpec([None, None], tf.int32), "target_ids": tf.TensorSpec([None, None], tf.int32)},
        tf.TensorSpec([None, None], tf.int32),
    )
    return tf.data.Dataset.from_generator(generate, output_signature=spec), len(pairs)


def score(trees, parsed):
    from keras_transformer.parsing import bracket_scores

    labelled = bracket_scores(trees, parsed)
    unlabelled = bracket_scores(trees, parsed, labelled=False)
    return {
        "sentences": labelled["sentences"],
        "labelled_precision": round(labelled["precision"], 2),
        "labelled_recall": round(labelled["recall"], 2),
        "labelled_f1": round(labelled["f1"], 2),
        "unlabelled_f1": round(unlabelled["f1"], 2),
        "exact": round(labelled["exact"], 2),
    }


def baselines(train, trees):
    """Right-branching and flat trees over the same sentences, labelled
    with the training set's most frequent root label and other label."""
    from keras_transformer.parsing import Tree
    from keras_transformer.parsing import label_counts
    from keras_transformer.parsing import right_branching

    root = max(("S", "NP", "FRAG", "SINV", "SBARQ", "SQ"), key=lambda l: sum(t.label == l for t in train))
    other = label_counts(train).most_common(1)[0][0]
    return {
        f"right-branching ({root} root, {other} below)": score(
            trees, [right_branching(t.words(), t.tags(), root, other) for t in trees]
        ),
        f"flat (one {root} over the words)": score(
            trees, [Tree(root, [Tree(tag, [word]) for tag, word in t.preterminals()]) for t in trees]
        ),
    }


def write_report(args, results, path):
    lines = [
        "# English constituency parsing (section 6.3) on the Penn Treebank sample",
        "",
        "```bash",
        "python recipes/ptb_parsing.py" + (f" --train-steps {args.train_steps}" if args.train_steps != 2000 else ""),
        "```",
        "",
        f"Data: NLTK's Penn Treebank sample (3,914 WSJ sentences), split by file: "
        f"wsj_0001-0159 train ({results['pairs']['train']:,} sentences, {results['pairs']['trained']:,} "
        f"of them with trees of at most {MAX_TRAIN_TOKENS} tokens used for training), "
        f"wsj_0160-0179 development ({results['pairs']['dev']:,}), wsj_0180-0199 test "
        f"({results['pairs']['test']:,}). The model: {results['parameters']:,} parameters "
        f"({json.dumps(results['model'])}), {args.train_steps:,} steps of about "
        f"{args.tokens_per_batch:,} target tokens, the average of the last 5 checkpoints; beam "
        f"{args.beam_size}, alpha {args.alpha}, at most length + {args.max_extra_length} tokens. "
        f"Trees write their words as {'themselves' if results['target_words'] == 'copied' else 'XX'} "
        f"(`--target-words {results['target_words']}`). "
        f"Trained in {results['train_minutes']:.0f} minutes on {results['machine']} "
        f"(Keras backend {results['keras_backend']}).",
        "",
        "EVALB's bracket scores (COLLINS.prm conventions: punctuation and part-of-speech tags out, "
        "ADVP = PRT):",
        "",
        "| parser | split | sentences | labelled P | labelled R | labelled F1 | unlabelled F1 | exact match |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for split in ("dev", "test"):
        for name, s in results[split].items():
            lines.append(
                f"| {name} | {split} | {s['sentences']} | {s['labelled_precision']:.2f} | "
                f"{s['labelled_recall']:.2f} | {s['labelled_f1']:.2f} | {s['unlabelled_f1']:.2f} | {s['exact']:.1f}% |"
            )
    lines += [
        "",
        f"Every one of the {results['pairs']['dev'] + results['pairs']['test']:,} parses is a well-formed "
        "tree over its sentence: the search cannot write anything else (`tests/test_parsing.py`).",
        "",
        "For scale: the paper trained on about 40,000 sentences (WSJ 02-21) and reached 91.3 F1 on "
        f"section 23 with a 4-layer, d_model 1024 model; this split trains on {results['pairs']['train']:,}. "
        "Words seen once in training are unknown to the model (read by their shape only).",
        "",
    ]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(lines))


def main(argv=None):
    args = parse_args(argv)
    import keras

    import keras_transformer as kt
    from keras_transformer.data.corpus import read_json_object
    from keras_transformer.data.corpus import write_atomically
    from keras_transformer.environment import describe_machine
    from keras_transformer.parsing import Parser
    from keras_transformer.parsing import ParsingVocabulary
    from keras_transformer.training import average_checkpoints
    from keras_transformer.training import compile_model
    from keras_transformer.training import fit
    from keras_transformer.training import list_checkpoints

    def log(line):
        print(line, flush=True)

    try:
        splits = read_splits(args.data_dir, args.smoke)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    log(", ".join(f"{split}: {len(trees)} sentences" for split, trees in splits.items()))
    if os.path.isdir(args.model_dir) and os.listdir(args.model_dir) and not args.resume:
        sys.exit(f"error: {args.model_dir} already holds a run; pass --resume to continue it, or another --model-dir.")
    os.makedirs(args.model_dir, exist_ok=True)
    vocabulary_path = os.path.join(args.model_dir, VOCABULARY_FILE)
    if os.path.isfile(vocabulary_path):
        vocabulary = ParsingVocabulary.load(vocabulary_path)
        if vocabulary.target_words != args.target_words:
            sys.exit(f"error: the run in {args.model_dir} writes words as {vocabulary.target_words}; "
                     f"resume it with --target-words {vocabulary.target_words}.")  # fmt: skip
    else:
        vocabulary = ParsingVocabulary.build(splits["train"], target_words=args.target_words)
        vocabulary.save(vocabulary_path)
    log(f"vocabulary: {len(vocabulary):,} tokens (tree tokens and training words seen twice or more)")

    keras.utils.set_random_seed(args.seed)
    model_arguments = {"num_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2, "dropout": 0.3} if args.smoke else MODEL
    model = kt.build_transformer("small", vocabulary_size=len(vocabulary), seed=args.seed, **model_arguments)
    compile_model(model, warmup_steps=args.warmup_steps)
    dataset, trained_pairs = batches(vocabulary, splits["train"], args.tokens_per_batch, args.seed)
    log(f"model: {model.count_params():,} parameters; {trained_pairs} training pairs")
    start = time.time()
    model = fit(model, dataset, args.model_dir, args.train_steps, checkpoint_every=args.checkpoint_every,
                keep_checkpoints=5, verbose=0 if args.smoke else 2)  # fmt: skip
    # Training time over every resumption of the run.
    time_path = os.path.join(args.model_dir, "train_minutes.json")
    train_minutes = read_json_object(time_path)["train_minutes"] if os.path.isfile(time_path) else 0.0
    train_minutes += (time.time() - start) / 60
    write_atomically(time_path, json.dumps({"train_minutes": train_minutes}))
    model = average_checkpoints(list_checkpoints(os.path.join(args.model_dir, "checkpoints")))
    model.save(os.path.join(args.model_dir, "model.keras"))

    parser = Parser(model, vocabulary, beam_size=args.beam_size, alpha=args.alpha,
                    max_extra_length=args.max_extra_length)  # fmt: skip
    results = {
        "pairs": {"train": len(splits["train"]), "trained": trained_pairs, "dev": len(splits["dev"]),
                  "test": len(splits["test"])},
        "model": model_arguments,
        "target_words": vocabulary.target_words,
        "parameters": int(model.count_params()),
        "train_minutes": round(train_minutes, 1),
        "machine": describe_machine(),
        "keras_backend": keras.backend.backend(),
    }  # fmt: skip
    for split in ("dev",) if args.dev_only else ("dev", "test"):
        trees = splits[split]
        start = time.time()
        parsed = parser.parse([t.words() for t in trees], [t.tags() for t in trees])
        seconds = time.time() - start
        results[split] = {"Transformer (ours)": score(trees, parsed)} | baselines(splits["train"], trees)
        results[split]["Transformer (ours)"]["seconds"] = round(seconds, 1)
        with open(os.path.join(args.model_dir, f"{split}.parsed"), "w", encoding="utf-8") as file:
            file.write("".join(str(tree) + "\n" for tree in parsed))
        for name, s in results[split].items():
            log(f"{split}, {name}: labelled F1 {s['labelled_f1']:.2f} (P {s['labelled_precision']:.2f}, "
                f"R {s['labelled_recall']:.2f}), unlabelled F1 {s['unlabelled_f1']:.2f}")
    with open(os.path.join(args.model_dir, "results.json"), "w") as file:
        json.dump(results, file, indent=2)
    if not args.smoke and not args.dev_only:
        write_report(args, results, args.report)
        log(f"report in {args.report}")


if __name__ == "__main__":
    main()
