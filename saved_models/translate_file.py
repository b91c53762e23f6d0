"""Translates a text file with an exported SavedModel, as a server would.

    python saved_models/translate_file.py saved_models/multi30k_en_de/1 \\
        --input test2016.en --output test2016.served.de

Imports TensorFlow and tensorflow-text only (no keras_transformer), loads
the export with `tf.saved_model.load`, and calls its `serving_default`
signature on batches of lines. Use it to translate files offline with an
export, or to check that an export translates as the model it came from:
the output should equal `keras-transformer translate` on that model.
"""

import argparse
import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("saved_model", help="a version folder, such as saved_models/NAME/1")
    parser.add_argument("--input", required=True, help="UTF-8 text, one sentence per line")
    parser.add_argument("--output", required=True, help="where the translations go, one per line")
    parser.add_argument("--batch-size", type=int, default=64, help="lines per request")
    args = parser.parse_args()
    if args.batch_size < 1:
        sys.exit(f"error: --batch-size must be >= 1; received {args.batch_size}")
    try:
        serve = tf.saved_model.load(args.saved_model).signatures["serving_default"]
    except (OSError, ValueError, KeyError) as error:
        sys.exit(f"error: cannot load a serving_default signature from {args.saved_model}: {error}")
    with open(args.input, "rb") as file:
        lines = file.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    translations = []
    for start in range(0, len(lines), args.batch_size):
        batch = tf.constant(lines[start : start + args.batch_size], tf.string)
        translations += [t.decode("utf-8") for t in serve(text=batch)["translation"].numpy()]
    with open(args.output, "w", encoding="utf-8") as file:
        file.write("".join(t + "\n" for t in translations))
    print(f"translated {len(lines)} lines of {args.input} into {args.output}")


if __name__ == "__main__":
    main()
