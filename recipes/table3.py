"""Rows of Table 3 (Vaswani et al., 2017) at a scale that fits a 2-core CPU.

    python recipes/table3.py                       # every row: runs/table3/, docs/table3.md
    python recipes/table3.py --rows base A1 E      # some rows
    python recipes/table3.py --smoke               # two rows, a few steps, to test the setup

Table 3 varies one thing at a time in the base model and reports, for each
variant, the perplexity (per subword) and BLEU on the development set and
the parameter count. Here the base model is shrunk so that each row trains
in a few minutes on Multi30k English-German (29,000 pairs):

- 2+2 layers, d_model 128, d_ff 512, h 4 heads of d_k = d_v = 32, P_drop
  0.1, eps_ls 0.1, a shared vocabulary of 8,000 BPE pieces;
- every row trains for the same number of steps (`--train-steps`, 800 by
  default: about 7 epochs; the schedule warms up over the first half) on
  the same 4,096-token batches, from the same seed, in float32;
- perplexity and BLEU are on `val` (1,014 pairs), the development set:
  `test2016` is not used. BLEU is sacreBLEU on beam 4, alpha 0.6, with the
  last checkpoint (no averaging, as in Table 3).

The rows keep the paper's letters and directions, scaled: (A) changes h at
a fixed d_model, so d_k = d_v = d_model / h; (B) halves d_k alone; (C)
changes N, d_model and d_ff; (D) changes dropout and label smoothing; (E)
learns the positions. "restricted" is section 4's self-attention to a
neighbourhood of r positions each side (Table 1), which Table 3 does not
have. The point is to see the paper's directions at this scale, not its
numbers. Each row also reports its training time per step: a band mask
costs as much as full attention here.

Each finished row is kept in `<out>/<row>/row.json`; a rerun trains only
the missing rows (a row cut off mid-way resumes from its checkpoints).
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

# Multi30k's task 1 text, as the Multi30k recipe reads it: gzipped or not.
from multi30k_en_de import DATA_DIR, data_file  # noqa: E402
TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "table3.md")

# The scaled-down base model: Table 3's "base" row.
BASE = {"num_layers": 2, "d_model": 128, "d_ff": 512, "num_heads": 4, "dropout": 0.1}
LABEL_SMOOTHING = 0.1

# row: (what changes from BASE, label smoothing, the cells the table shows).
# d_k and d_v are left to their default, d_model / h, unless a row sets them.
ROWS = {
    "base": ({}, LABEL_SMOOTHING),
    "A1": ({"num_heads": 1}, LABEL_SMOOTHING),
    "A16": ({"num_heads": 16}, LABEL_SMOOTHING),
    "A32": ({"num_heads": 32}, LABEL_SMOOTHING),
    "B16": ({"key_dim": 16, "value_dim": 32}, LABEL_SMOOTHING),
    "C1": ({"num_layers": 1}, LABEL_SMOOTHING),
    "C4": ({"num_layers": 4}, LABEL_SMOOTHING),
    "C256": ({"d_model": 256}, LABEL_SMOOTHING),
    "C2048": ({"d_ff": 2048}, LABEL_SMOOTHING),
    "D0.0": ({"dropout": 0.0}, LABEL_SMOOTHING),
    "D0.3": ({"dropout": 0.3}, LABEL_SMOOTHING),
    "Dls0.0": ({}, 0.0),
    "Dls0.2": ({}, 0.2),
    "E": ({"position_encoding": "learned"}, LABEL_SMOOTHING),
    "restricted r=3": ({"attention_window": 3}, LABEL_SMOOTHING),
}
# About an hour on 2 CPU cores; the other rows run with --rows.
DEFAULT_ROWS = ["base", "A1", "A16", "B16", "C1", "C256", "D0.0", "Dls0.0", "E", "restricted r=3"]
SMOKE_ROWS = ["base", "E"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=DATA_DIR, help="holds train and val .en/.de, as in github.com/multi30k/dataset's data/task1/raw, gzipped as it comes or not (default: multi30k)")
    parser.add_argument("--out", default=os.path.join("runs", "table3"), help="a directory per row")
    parser.add_argument("--table", default=TABLE_FILE, help="where the markdown table goes")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), help="default: all")
    parser.add_argument("--train-steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="also show TensorFlow's, XLA's and SentencePiece's log lines")
    parser.add_argument("--smoke", action="store_true", help="two rows, a few steps on a few pairs, to test the setup")
    args = parser.parse_args(argv)
    if args.train_steps < 1:
        parser.error(f"--train-steps must be >= 1. Received: {args.train_steps}")
    return args


def row_config(args, row, vocabulary):
    """The `TrainingConfig` of one row."""
    from keras_transformer.training import TrainingConfig

    changes, label_smoothing = ROWS[row]
    data = lambda split, language: data_file(args.data_dir, split, language)  # noqa: E731
    config = TrainingConfig(
        model_dir=os.path.join(args.out, row.replace(" ", "_").replace("=", "")),
        train_source=[data("train", "en")],
        train_target=[data("train", "de")],
        valid_source=[data("val", "en")],
        valid_target=[data("val", "de")],
        vocabulary=vocabulary,
        vocabulary_size=8000,
        preset="small",
        model=BASE | changes,
        dtype="float32",
        tokens_per_batch=4096,
        max_tokens=128,
        warmup_steps=max(1, args.train_steps // 2),
        label_smoothing=label_smoothing,
        train_steps=args.train_steps,
        checkpoint_every=args.train_steps,
        average=1,
        valid_bleu_sentences=0,
        beam_size=4,
        alpha=0.6,
        seed=args.seed,
        log_every=max(1, args.train_steps // 5),
    )
    if args.smoke:
        config.vocabulary_size = 1000
        config.train_steps = config.checkpoint_every = min(args.train_steps, 3)
        config.warmup_steps = 2
        config.tokens_per_batch = 512
        config.valid_pairs = 16
        config.log_every = 2
    return config


def shared_vocabulary(args, log):
    """The BPE vocabulary every row uses, trained once into `<out>/vocabulary`."""
    from keras_transformer.data import SubwordTokenizer
    from keras_transformer.data import read_parallel_text
    from keras_transformer.data.tokenizer import MODEL_FILE

    directory = os.path.join(args.out, "vocabulary")
    if not os.path.isfile(os.path.join(directory, MODEL_FILE)):
        train = read_parallel_text(data_file(args.data_dir, "train", "en"), data_file(args.data_dir, "train", "de"))
        size = row_config(args, "base", None).vocabulary_size
        SubwordTokenizer.train(train, size, seed=args.seed).save(directory)
        log(f"vocabulary: {size} shared BPE pieces in {directory}")
    return directory


def run_row(args, row, vocabulary, valid, log):
    """Trains one row (or resumes it) and scores it on the validation set."""
    import numpy as np

    from keras_transformer.data.corpus import write_atomically
    from keras_transformer.environment import describe_machine
    from keras_transformer.bleu import score_translations
    from keras_transformer.training import train_translator
    from keras_transformer.training.progress import read_history
    from keras_transformer.training.config import HISTORY_FILE

    config = row_config(args, row, vocabulary)
    done = os.path.join(config.model_dir, "row.json")
    if os.path.isfile(done):
        with open(done) as file:
            return json.load(file)
    resume = os.path.isfile(os.path.join(config.model_dir, "train_config.json"))
    log(f"=== row {row}: {json.dumps(ROWS[row][0])}, eps_ls {ROWS[row][1]}" + (" (resuming)" if resume else ""))
    translator = train_translator(config, resume=resume, log=log)
    history = read_history(os.path.join(config.model_dir, HISTORY_FILE))
    start = time.time()
    hypotheses = translator.translate(list(valid.sources))
    decode_seconds = time.time() - start
    score = score_translations(hypotheses, list(valid.targets))
    model = translator.model
    result = {
        "row": row,
        "changes": ROWS[row][0],
        "label_smoothing": ROWS[row][1],
        "architecture": {k: v for k, v in model.get_config().items() if k not in ("name", "trainable", "dtype", "seed")},
        "parameters": int(model.count_params()),
        "train_steps": config.train_steps,
        "train_seconds": history[-1]["train_seconds"],
        "ms_per_step": round(1000 * history[-1]["train_seconds"] / config.train_steps, 1),
        "val_perplexity": history[-1]["val_perplexity"],
        "val_bleu": round(score["bleu"], 2),
        "bleu_signature": score["bleu_signature"],
        "decode_seconds": round(decode_seconds, 1),
        "val_sentences": len(hypotheses),
        "machine": describe_machine(),
        "keras_backend": __import__("keras").backend.backend(),
    }
    plain = lambda x: x.item() if isinstance(x, np.generic) else str(x)  # noqa: E731
    write_atomically(done, json.dumps(result, indent=2, default=plain))
    log(f"row {row}: val perplexity {result['val_perplexity']:.2f}, val BLEU {result['val_bleu']:.2f}, "
        f"{result['parameters']:,} parameters, {result['ms_per_step']:.0f} ms/step")
    return result


def markdown_table(results):
    """Table 3's columns, from the rows' results."""
    base = next((r for r in results if r["row"] == "base"), None)
    lines = [
        "| row | N | d_model | d_ff | h | d_k | d_v | P_drop | eps_ls | positions | r | "
        "val PPL | val BLEU | params | ms/step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        a = result["architecture"]
        key_dim = a["key_dim"] or a["d_model"] // a["num_heads"]
        value_dim = a["value_dim"] or key_dim

        def cell(value, base_value):
            # Like Table 3: a row shows only what differs from the base.
            return "" if base is not None and result is not base and value == base_value else str(value)

        b = base["architecture"] if base else a
        base_key_dim = b["key_dim"] or b["d_model"] // b["num_heads"]
        cells = [
            result["row"],
            cell(a["num_layers"], b["num_layers"]),
            cell(a["d_model"], b["d_model"]),
            cell(a["d_ff"], b["d_ff"]),
            cell(a["num_heads"], b["num_heads"]),
            cell(key_dim, base_key_dim),
            cell(value_dim, b["value_dim"] or base_key_dim),
            cell(a["dropout"], b["dropout"]),
            cell(result["label_smoothing"], base["label_smoothing"] if base else None),
            cell(a["position_encoding"], b["position_encoding"]),
            cell(a["attention_window"] if a["attention_window"] is not None else "all", "all"),
            f"{result['val_perplexity']:.2f}",
            f"{result['val_bleu']:.1f}",
            f"{result['parameters'] / 1e6:.2f}M",
            f"{result['ms_per_step']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_table(args, results):
    first = results[0]
    text = "\n".join([
        "# Table 3 at a small scale",
        "",
        "Rows of Table 3 of the paper (and section 4's restricted self-attention), each trained "
        f"for {first['train_steps']:,} steps on Multi30k English-German and scored on its "
        f"validation set ({first['val_sentences']:,} sentences; the test set is not used). "
        "A blank cell is the base row's value. Perplexity is per subword, on the 8,000-piece "
        "shared BPE vocabulary; BLEU is sacreBLEU of beam 4, alpha 0.6, on the last checkpoint. "
        "ms/step is the training time per 4,096-token step, averaged over the run: the first "
        "step's compilation and the validation at the end included.",
        "",
        "```bash",
        "python recipes/table3.py" + ("" if args.train_steps == 800 else f" --train-steps {args.train_steps}"),
        "```",
        "",
        f"Machine: {first['machine']}; Keras backend {first['keras_backend']}. One seed ({args.seed}) "
        "per row: a difference smaller than the spread between seeds, which this table does not "
        "measure, may be noise.",
        "",
        markdown_table(results),
        "",
        f"BLEU signature: `{first['bleu_signature']}`",
        "",
    ])
    os.makedirs(os.path.dirname(os.path.abspath(args.table)), exist_ok=True)
    with open(args.table, "w", encoding="utf-8") as file:
        file.write(text)


def main(argv=None):
    args = parse_args(argv)
    from keras_transformer.data import read_parallel_text

    def log(line):
        print(line, flush=True)

    rows = args.rows or (SMOKE_ROWS if args.smoke else DEFAULT_ROWS)
    try:
        valid = read_parallel_text(data_file(args.data_dir, "val", "en"), data_file(args.data_dir, "val", "de"))
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    if args.smoke:
        valid = valid[:16]
    results = []
    started = time.time()
    try:
        vocabulary = shared_vocabulary(args, log)
        for row in rows:
            results.append(run_row(args, row, vocabulary, valid, log))
            write_table(args, results)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    log(f"{len(results)} rows in {(time.time() - started) / 60:.1f} minutes; table in {args.table}")
    log(markdown_table(results))


if __name__ == "__main__":
    main()
