"""Latency of the exported SavedModel against `Translator.translate`.

    python benchmarks/export_latency.py                             # random-weight small preset
    python benchmarks/export_latency.py --model-dir runs/quickstart # a trained model
    KERAS_BACKEND=jax python benchmarks/export_latency.py           # Translator under JAX

Both routes translate the same requests with the same weights and search
settings (beam 4, alpha 0.6 unless the model directory says otherwise):

- `Translator.translate` in Python, under the current Keras backend;
- the `serving_default` signature of the SavedModel that
  `export_saved_model` writes, loaded with `tf.saved_model.load` in this
  process: the graph a TF Serving host runs, without its network hop.

Requests are one sentence, and batches of 32 sentences, taken in turn from
the built-in corpus's test split. The two routes alternate request by
request, after warm-up calls, so that machine noise falls on both. The
report gives p50 and p99 latency in milliseconds and the ratio
Translator / export (above 1: the export is faster).

Without `--model-dir`, the model is the `small` preset with random weights
and a vocabulary trained on the built-in corpus. Random weights seldom emit
EOS, so each sentence decodes to its limit (source length + 50 tokens) on
both routes.
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.data import SubwordTokenizer  # noqa: E402
from keras_transformer.data import builtin_corpus  # noqa: E402
from keras_transformer.export import export_saved_model  # noqa: E402


def random_translator(preset, vocabulary_size):
    tokenizer = SubwordTokenizer.train(builtin_corpus("train", size=5000, seed=0), vocabulary_size)
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(preset, vocabulary_size=tokenizer.vocabulary_size)
    return kt.Translator(model, tokenizer)


def measure(routes, requests, warmup):
    """Milliseconds per request for each route, the routes alternating."""
    for batch in requests[:warmup]:
        for route in routes.values():
            route(batch)
    times = {name: [] for name in routes}
    for i, batch in enumerate(requests[warmup:]):
        names = list(routes) if i % 2 == 0 else list(reversed(routes))
        for name in names:
            start = time.perf_counter()
            routes[name](batch)
            times[name].append(1000 * (time.perf_counter() - start))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="a directory written by Translator.save")
    parser.add_argument("--preset", default="small", help="without --model-dir")
    parser.add_argument("--vocabulary-size", type=int, default=1000, help="without --model-dir")
    parser.add_argument("--single-requests", type=int, default=100)
    parser.add_argument("--batch-requests", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    if args.model_dir:
        translator = kt.Translator.load(args.model_dir)
        what = args.model_dir
    else:
        translator = random_translator(args.preset, args.vocabulary_size)
        what = f"{args.preset} preset, random weights"
    sentences = builtin_corpus("test", size=2000, seed=0).sources
    with tempfile.TemporaryDirectory() as directory:
        path = export_saved_model(translator, os.path.join(directory, "1"))
        serving_default = tf.saved_model.load(path).signatures["serving_default"]

        def exported(texts):
            return serving_default(text=tf.constant(texts))["translation"].numpy()

        routes = {"Translator.translate": translator.translate, "exported serving_default": exported}
        # The two routes give the same translations.
        check = sentences[: args.batch_size]
        same = sum(a == b.decode() for a, b in zip(translator.translate(check), exported(check)))

        print(
            f"backend {keras.backend.backend()}, {what}, beam {translator.beam_size}, "
            f"alpha {translator.alpha}; {same}/{len(check)} translations identical"
        )
        for batch_size, count in ((1, args.single_requests), (args.batch_size, args.batch_requests)):
            requests = [
                sentences[(i * batch_size) % len(sentences) :][:batch_size]
                for i in range(args.warmup + count)
            ]
            times = measure(routes, requests, args.warmup)
            p = {name: np.percentile(t, [50, 99]) for name, t in times.items()}
            for name, (p50, p99) in p.items():
                print(f"  batch {batch_size:2d}  {name:26s} p50 {p50:8.1f} ms  p99 {p99:8.1f} ms  ({count} requests)")
            (t50, t99), (e50, e99) = p.values()
            print(f"  batch {batch_size:2d}  Translator / export:       p50 {t50 / e50:.2f}x     p99 {t99 / e99:.2f}x")


if __name__ == "__main__":
    main()
