"""CTranslate2 in a process of its own, for `decoding_engines.py`.

After a CTranslate2 batch had run in the benchmark's process, torch's
decoding in that process stayed slower, idle pauses or not: ours 1.05 ->
1.21 s and `transformers` 1.01 -> 1.06 s per batch (base, batch 32,
greedy, median of 3; see benchmarks/README.md). So CTranslate2 runs here,
and the benchmark sends each batch over a pipe.

Requests and replies are pickled tuples, one each way:

- `("load", key, model_directory, compute_type, threads)` -> `("ok", None)`;
- `("decode", key, batch, beam_size, output_length, alpha)` ->
  `("ok", lengths)`, the length of each sentence's best hypothesis;
- anything that fails -> `("error", message)`.
"""

import os
import pickle
import sys


def serve(requests, replies):
    import ctranslate2

    translators = {}
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            kind, key, *arguments = request
            if kind == "load":
                directory, compute_type, threads = arguments
                translators[key] = ctranslate2.Translator(
                    directory, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads,
                )
                reply = ("ok", None)
            elif kind == "decode":
                batch, beam_size, output_length, alpha = arguments
                results = translators[key].translate_batch(
                    batch, beam_size=beam_size, max_batch_size=0,
                    max_decoding_length=output_length, min_decoding_length=output_length,
                    length_penalty=alpha, num_hypotheses=1,
                )
                reply = ("ok", [len(result.hypotheses[0]) for result in results])
            else:
                reply = ("error", f"unknown request {kind!r}; expected 'load' or 'decode'")
        except Exception as error:  # noqa: BLE001 - sent back to the benchmark, which raises it
            reply = ("error", f"{type(error).__name__}: {error}")
        pickle.dump(reply, replies)
        replies.flush()


if __name__ == "__main__":
    # The replies take standard output's pipe; whatever else writes to
    # standard output goes to standard error instead.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)
