"""What one request can cost a server of the exported SavedModel.

    python benchmarks/serving_bounds.py --model-dir runs/quickstart
    python benchmarks/serving_bounds.py --model-dir runs/quickstart --random-weights

Exports the translator with the default bounds (`max_request_tokens` 8,192
source tokens per request; each text cut to `max_source_bytes` before it is
tokenized), then serves each request below from a fresh process that has
loaded the SavedModel and answered one short warm-up request, as a server
would be, and reports its latency and how much the process's peak memory
(its resident set, sampled every 5 ms) grew:

- `worst allowed`: as many rows of `max_source_length` tokens as the budget
  takes (32 rows of 256 tokens by default), random words of the built-in
  corpus, so every row is cut at the limit;
- `10 MB string`: one text of 10 MB, cut before tokenizing;
- `over budget`: the request the issue measured before there were bounds
  (256 texts of about 1.3 KB), refused now with INVALID_ARGUMENT; and the
  same request served by a second export whose budget admits it, which is
  what it cost before.

`--random-weights` swaps in random weights of the same model: they seldom
emit EOS, so every row decodes to its limit (source length +
`max_extra_length` tokens), the worst case for the search. A trained model
stops at its translations' ends.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SCENARIOS = ("warm-up only", "worst allowed", "10 MB string", "over budget", "over budget, admitted")


def resident_mib():
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def serve(saved_model, scenario, texts_file):
    """Runs in a fresh process: loads, warms up, serves one request, and
    samples its resident memory every 5 ms while the request runs."""
    import threading
    import time

    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - the SentencePiece ops

    served = tf.saved_model.load(saved_model).signatures["serving_default"]
    served(text=tf.constant(["the dog ."]))
    with open(texts_file) as file:
        texts = json.load(file)[scenario]
    before = peak = resident_mib()
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, resident_mib())

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    try:
        outputs = served(text=tf.constant(texts))
        result = f"{len(outputs['translation'].numpy())} translations"
    except tf.errors.InvalidArgumentError as error:
        found = re.search(r"The request holds[^.]*\.", error.message)
        result = "refused: " + (found.group(0) if found else error.message[:120]).replace("\n", " ")
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    print(json.dumps({"seconds": seconds, "rss_before_mib": before,
                      "rss_peak_mib": max(peak, resident_mib()), "result": result}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="runs/quickstart")
    parser.add_argument("--random-weights", action="store_true")
    args = parser.parse_args()

    import numpy as np

    import keras_transformer as kt
    from keras_transformer.data import builtin_corpus
    from keras_transformer.export import export_saved_model
    from keras_transformer.export.saved_model import DEFAULT_MAX_REQUEST_TOKENS
    from keras_transformer.export.saved_model import max_source_bytes

    translator = kt.Translator.load(args.model_dir)
    if args.random_weights:
        model = kt.Transformer.from_config(translator.model.get_config())
        translator = kt.Translator(model, translator.tokenizer, **translator.get_config())
    length = translator.max_source_length
    rng = np.random.default_rng(0)
    words = sorted({w for source, _ in builtin_corpus("train", size=2000) for w in source.split()})

    def text_of_at_least(tokens):
        text = ""
        while len(translator.tokenizer.tokenize(text)) < tokens:
            text += " ".join(rng.choice(words, 64)) + " "
        return text.strip()

    full_row = text_of_at_least(length)
    requests = {
        "warm-up only": ["the dog ."],
        "worst allowed": [full_row] * (DEFAULT_MAX_REQUEST_TOKENS // length),
        "10 MB string": [(full_row + " ") * (10 * 2**20 // (len(full_row) + 1))],
        "over budget": [full_row[:1400]] * 256,
    }
    requests["over budget, admitted"] = requests["over budget"]
    with tempfile.TemporaryDirectory() as work:
        saved_model = export_saved_model(translator, os.path.join(work, "1"))
        admitting = export_saved_model(translator, os.path.join(work, "2"), 256 * length)
        texts_file = os.path.join(work, "texts.json")
        with open(texts_file, "w") as file:
            json.dump(requests, file)
        print(f"model: {args.model_dir}{' (random weights)' if args.random_weights else ''}, "
              f"beam {translator.beam_size}, max_source_length {length}, "
              f"max_extra_length {translator.max_extra_length}, max_request_tokens "
              f"{DEFAULT_MAX_REQUEST_TOKENS}, max_source_bytes {max_source_bytes(translator)}")
        print("| request | texts x bytes | latency (s) | resident after warm-up (MiB) | peak growth during the request (MiB) | result |")
        print("| --- | --- | --- | --- | --- | --- |")
        for scenario in SCENARIOS:
            texts = requests[scenario]
            output = subprocess.run(
                [sys.executable, __file__, "--serve",
                 admitting if scenario.endswith("admitted") else saved_model, scenario, texts_file],
                capture_output=True, text=True, check=True,
                env={**os.environ, "KERAS_BACKEND": "tensorflow"},
            ).stdout.strip().splitlines()[-1]
            measured = json.loads(output)
            print(f"| {scenario} | {len(texts)} x {len(texts[0].encode()):,} | {measured['seconds']:.2f} "
                  f"| {measured['rss_before_mib']:.0f} | {measured['rss_peak_mib'] - measured['rss_before_mib']:.0f} "
                  f"| {measured['result']} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(*sys.argv[2:5])
    else:
        main()
