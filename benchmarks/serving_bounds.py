"""What one request can cost a server of the exported SavedModel.

    python benchmarks/serving_bounds.py --model-dir runs/multi30k_en_de
    python benchmarks/serving_bounds.py --model-dir runs/multi30k_en_de --presets tiny small base

Exports a translator with the default bounds (a request may cost
`request_budget`: what 32 texts of `max_source_length` tokens cost, counted
as texts x (longest + `max_extra_length`), and at most 64 texts; each text
cut to `max_source_bytes` before it is tokenized), then serves each request below
from a fresh process that has loaded the SavedModel and answered one short
warm-up request, as a server would be, and reports its latency and how much
the process's peak memory (its resident set, sampled every 5 ms) grew:

- `full rows`: as many rows of `max_source_length` tokens as the budget
  takes (32), random words of the built-in corpus: the documented worst;
- `short rows`, `quarter rows`, `half rows`: as many texts of one token,
  a quarter and a half of `max_source_length` as both bounds allow;
- `one full, rest short`: one full row and 31 one-token texts;
- `10 MB string`: one text of 10 MB, cut before tokenizing;
- `4,096 one-token texts`: refused now with INVALID_ARGUMENT.

The last column is each request's latency and memory over the full rows'.
With `--presets`, each preset's model is built with random weights on the
model directory's vocabulary: random weights seldom emit EOS, so every row
decodes to its limit (length + `max_extra_length` tokens), the worst case
for the search. Without it, the trained model in `--model-dir` is served; it
stops at its translations' ends.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SCENARIOS = (
    "full rows", "short rows", "quarter rows", "half rows", "one full, rest short", "10 MB string", "4,096 one-token texts",
)


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
        found = re.search(r"The request (costs|holds)[^.]*\.", error.message)
        result = "refused: " + (found.group(0) if found else error.message[:120]).replace("\n", " ")
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    print(json.dumps({"seconds": seconds, "rss_before_mib": before,
                      "rss_peak_mib": max(peak, resident_mib()), "result": result}))


def requests_for(translator, budget, max_rows):
    """The requests, by scenario, for `translator` and its bounds."""
    import numpy as np

    from keras_transformer.data import builtin_corpus

    length, extra = translator.max_source_length, translator.max_extra_length
    rng = np.random.default_rng(0)
    words = sorted({w for source, _ in builtin_corpus("train", size=2000) for w in source.split()})
    one_token = next(w for w in words if len(translator.tokenizer.tokenize(w)) == 1)

    def text_of(tokens):
        """Random words cut to exactly `tokens` subword tokens (without EOS)."""
        text = ""
        while len(translator.tokenizer.tokenize(text)) < tokens:
            text += " ".join(rng.choice(words, 64)) + " "
        return translator.tokenizer.detokenize(translator.tokenizer.tokenize(text)[:tokens])

    full_row, quarter, half = text_of(length), text_of(length // 4 - 1), text_of(length // 2 - 1)
    rows = budget // (length + extra)

    def most(tokens):  # the most texts of `tokens` tokens (with EOS) both bounds allow
        return min(max_rows, budget // (tokens + extra))

    return {
        "warm-up only": ["the dog ."],
        "full rows": [full_row] * rows,
        "short rows": [one_token] * most(2),
        "quarter rows": [quarter] * most(length // 4),
        "half rows": [half] * most(length // 2),
        "one full, rest short": [full_row] + [one_token] * (rows - 1),
        "10 MB string": [(full_row + " ") * (10 * 2**20 // (len(full_row) + 1))],
        "4,096 one-token texts": [one_token] * 4096,
    }


def measure(translator, label, work):
    """Exports `translator` and serves each scenario from a fresh process;
    prints a table row each."""
    from keras_transformer.export import export_saved_model
    from keras_transformer.export.saved_model import max_source_bytes
    from keras_transformer.export.saved_model import request_bounds

    budget, max_rows = request_bounds(translator)  # the export's defaults
    requests = requests_for(translator, budget, max_rows)
    folder = os.path.join(work, re.sub(r"\W+", "_", label))
    saved_model = export_saved_model(translator, os.path.join(folder, "1"))
    texts_file = os.path.join(folder, "texts.json")
    with open(texts_file, "w") as file:
        json.dump(requests, file)
    print(f"\n{label}: beam {translator.beam_size}, max_source_length {translator.max_source_length}, "
          f"max_extra_length {translator.max_extra_length}, max_request_tokens {budget}, "
          f"max_request_rows {max_rows}, "
          f"max_source_bytes {max_source_bytes(translator)}")
    print("| request | texts x bytes | latency (s) | resident after warm-up (MiB) "
          "| peak growth (MiB) | result | latency / memory over full rows |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    worst = None
    for scenario in SCENARIOS:
        texts = requests[scenario]
        output = subprocess.run(
            [sys.executable, __file__, "--serve", saved_model, scenario, texts_file],
            capture_output=True, text=True, check=True,
            env={**os.environ, "KERAS_BACKEND": "tensorflow"},
        ).stdout.strip().splitlines()[-1]
        measured = json.loads(output)
        growth = measured["rss_peak_mib"] - measured["rss_before_mib"]
        worst = worst or (measured["seconds"], growth)
        print(f"| {scenario} | {len(texts):,} x {len(texts[0].encode()):,} | {measured['seconds']:.2f} "
              f"| {measured['rss_before_mib']:.0f} | {growth:.0f} | {measured['result']} "
              f"| {measured['seconds'] / worst[0]:.2f} / {growth / max(worst[1], 1):.2f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="runs/multi30k_en_de", help="a trained translator (its vocabulary)")
    parser.add_argument("--presets", nargs="*", help="also these presets with random weights")
    args = parser.parse_args()

    import keras_transformer as kt

    trained = kt.Translator.load(args.model_dir)
    with tempfile.TemporaryDirectory() as work:
        measure(trained, f"trained: {args.model_dir}", work)
        for preset in args.presets or []:
            model = kt.build_transformer(preset, vocabulary_size=trained.tokenizer.vocabulary_size)
            translator = kt.Translator(model, trained.tokenizer, beam_size=4, alpha=0.6)
            measure(translator, f"{preset}, random weights", work)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(*sys.argv[2:5])
    else:
        main()
