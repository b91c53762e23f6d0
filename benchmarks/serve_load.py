"""Serving under load, on loopback: `keras-transformer serve` against itself
unbatched and against a CTranslate2 server.

    KERAS_BACKEND=jax python benchmarks/serve_load.py --json OUT
    KERAS_BACKEND=torch python benchmarks/serve_load.py --json OUT
    KERAS_BACKEND=jax python benchmarks/serve_load.py --size tiny --requests 8     # a smoke run: minutes of warm-up
    python benchmarks/serve_load.py --size tiny --requests 4 --no-warm-up     # a smoke run without warm-up, a minute
    KERAS_BACKEND=jax python benchmarks/serve_load.py --servers ours ctranslate2 --concurrency 32
    python benchmarks/serve_load.py --splitters --json benchmarks/results/sentence_splitters.json

Three servers of the same random weights, opus-mt-en-de's size (`--size
tiny` for a smoke run), each started alone, measured at every concurrency,
then stopped, so that they never share the cores:

- `ours`: `python -m keras_transformer serve --model-dir DIR --languages
  en-de`, the sentences of concurrent requests decoded together;
- `ours-unbatched`: the same with `--no-batching`, each request's
  sentences decoded alone, one request after another;
- `ctranslate2`: `_support.py`'s `ctranslate2-server`, a server of the kind users build on the
  same ASGI stack (Starlette and uvicorn): CTranslate2's own conversion of
  the weights, float32, `translate_batch` of the one sentence in
  Starlette's thread pool, `inter_threads=1`, `intra_threads` every core.

The weights are `decoding_engines.random_opus_mt`'s (a random
`MarianMTModel`, converted by `keras_transformer.convert` and by
CTranslate2's converter), whose logits bias keeps EOS from ever winning:
every server decodes each sentence to its limit, source pieces +
`max_extra_length` (the converted translator's, with its beam and length
penalty, which the CTranslate2 server is given). So that the sentences
have real lengths, the model's SentencePiece files are replaced by one
trained here on Multi30k's English training side (`--spm-vocab` pieces),
numbered by `vocab.json` after Marian's EOS and UNK, filler words after
them up to the vocabulary (`tiny` grows to hold them). The run checks that
our tokenizer and the CTranslate2 server cut each sentence into the same
pieces, that our translator decodes a sentence to its limit (in this
process), and that the CTranslate2 server's every answer has that many
tokens.

Clients are threads of the standard library, one keep-alive
`http.client` connection each, `--concurrency` of them at a time, sending
`--requests` requests per cell, and at least `--rounds` per client (a cell
at concurrency 32 is then 4 batches of ours, not mostly its ramp), after
`--warm-up` untimed ones, one at a time: each a single sentence of
Multi30k's test2016.en in file order (`POST /translate`, LibreTranslate's
JSON). A cell stops at
`--max-seconds`, reported as such, and the server's later cells are
skipped. Reported for each server and concurrency: sentences per second
(answered requests over the cell's wall time), p50, p95 and p99 latency,
p99 over p50, and for ours the mean sentences per decoded batch (from its
`/metrics`); then the issue's targets: at concurrency 32, ours' throughput
at least 3x unbatched and at least 1.0x CTranslate2; at concurrency 1,
ours' p99 at most 1.5x its p50. Each server's start-up line (ours: the
warm-up's programs and seconds) is kept in the report.

`--splitters` compares, instead, the sentence splitters the server could
use (`pip install pysbd sentencex syntok`): the WMT news test sets hold one
sentence per line, in their documents' order, so every 5 lines joined by a
space make a paragraph whose sentences are known. Each splitter splits the
first `--paragraphs` (600) of newstest2013 and newstest2014, in English and
German (../shared/data/wmt14). Reported for each: the boundaries found that
are true (precision), the true ones found (recall), the paragraphs split
exactly into their lines, and sentences per second (the best of 3 passes).
The splitters, rule-based and multilingual: `pysbd` (the Pragmatic
Segmenter's rules, 22 languages), `sentencex` (Wikimedia's, native, rules
for many languages and fallbacks for the rest) and `syntok` (English,
German, Spanish).
"""

import argparse
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from decoding_engines import CONVERTED_SIZES  # noqa: E402
from decoding_engines import LATENCY_SOURCE  # noqa: E402
from decoding_engines import _Vocabulary  # noqa: E402
from decoding_engines import random_opus_mt  # noqa: E402
from decoding_engines import read_sentences  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN_SOURCE = os.path.join(os.path.dirname(LATENCY_SOURCE), "train.en")
SERVERS = ["ours", "ours-unbatched", "ctranslate2"]
HOST = "127.0.0.1"
TARGETS = {  # the issue's: (what, bound)
    "ours/ours-unbatched throughput, c=32": (">=", 3.0),
    "ours/ctranslate2 throughput, c=32": (">=", 1.0),
    "ours p99/p50, c=1": ("<=", 1.5),
}


# The model -------------------------------------------------------------------------


def multi30k_pieces(vocabulary_size, train_source):
    """A SentencePiece model (bytes) of `train_source` (Multi30k's English
    training side)."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(read_sentences(train_source)), model_writer=model, vocab_size=vocabulary_size,
        minloglevel=2,
    )
    return model.getvalue()


def build_models(size_name, spm_vocabulary, work, train_source=TRAIN_SOURCE, max_extra_length=None):
    """The random OPUS-MT model with Multi30k's pieces, converted both ways:
    {"ours", "ctranslate2", "spm": directories and path, "settings":
    translator.json, "translator": ours, loaded here}. `max_extra_length`,
    if given, replaces the converted translator's."""
    import ctranslate2
    import sentencepiece

    from keras_transformer.convert import convert
    from keras_transformer.decoding import Translator

    spm = multi30k_pieces(spm_vocabulary, train_source)
    processor = sentencepiece.SentencePieceProcessor(model_proto=spm)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not processor.is_control(i) and not processor.is_unknown(i)]
    size = dict(CONVERTED_SIZES[size_name])
    vocabulary_size = max(size["vocab_size"], len(pieces) + 3)  # and Marian's EOS, UNK, PAD
    size.update(vocab_size=vocabulary_size, pad_token_id=vocabulary_size - 1,
                decoder_start_token_id=vocabulary_size - 1)
    # Marian's layout: EOS 0, UNK 1, words, PAD last.
    tokens = ["</s>", "<unk>"] + pieces
    tokens += [f"w{i}" for i in range(len(tokens), vocabulary_size - 1)] + ["<pad>"]
    hf = os.path.join(work, "transformers")
    random_opus_mt(hf, size)
    with open(os.path.join(hf, "vocab.json"), "w") as file:
        json.dump({token: i for i, token in enumerate(tokens)}, file)
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(hf, name), "wb") as file:
            file.write(spm)
    translator = convert(hf, os.path.join(work, "ours"))
    if max_extra_length is not None:
        # In translator.json, which ours' servers read and the CTranslate2 server is given.
        translator = Translator.load(os.path.join(work, "ours"), max_extra_length=max_extra_length)
        translator.save_settings(os.path.join(work, "ours"))

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _Vocabulary(tokens)  # the pieces of vocab.json, in its order

    Converter(hf).convert(os.path.join(work, "ctranslate2"))
    with open(os.path.join(work, "ours", "translator.json")) as file:
        settings = json.load(file)
    return {"ours": os.path.join(work, "ours"), "ctranslate2": os.path.join(work, "ctranslate2"),
            "spm": os.path.join(hf, "source.spm"), "settings": settings, "translator": translator,
            "size": size}


def source_lengths(models, sentences):
    """The pieces of each sentence, checked to be as many in our tokenizer as
    in SentencePiece's own (the CTranslate2 server's)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=models["spm"])
    lengths = [len(pieces) for pieces in processor.encode(sentences, out_type=str)]
    ours = [len(ids) for ids in models["translator"].tokenizer.tokenize(sentences)]
    different = [i for i, (a, b) in enumerate(zip(lengths, ours)) if a != b]
    if different:
        i = different[0]
        raise RuntimeError(f"{len(different)} sentences have a different number of pieces in ours and "
                           f"SentencePiece's, the first {sentences[i]!r}: {ours[i]} and {lengths[i]}")
    return lengths


def check_ours_decodes_to_limit(translator, sentence):
    """Our translator, in this process, decodes `sentence` to its limit."""
    ids = translator.tokenizer.tokenize(sentence) + [translator.tokenizer.eos_id]
    ((output, _),) = translator.search_ids([ids])
    decoded, limit = int(np.count_nonzero(output[0])), len(ids) - 1 + translator.max_extra_length
    if decoded != limit:
        raise RuntimeError(f"ours decoded {decoded} tokens of {sentence!r}; expected its limit, {limit}")
    return decoded


# The servers -----------------------------------------------------------------------


def free_port():
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def server_command(name, models, port, threads, no_warm_up=False, max_source_length=48):
    if name.startswith("ours"):
        command = [sys.executable, "-m", "keras_transformer", "serve", "--model-dir", models["ours"],
                   "--languages", "en-de", "--port", str(port), "--max-source-length", str(max_source_length)]
        command += ["--no-warm-up"] if no_warm_up else []
        return command + (["--no-batching"] if name == "ours-unbatched" else [])
    settings = models["settings"]
    return [sys.executable, os.path.join(HERE, "_support.py"), "ctranslate2-server", "--model-dir", models["ctranslate2"],
            "--source-spm", models["spm"], "--target-spm", models["spm"], "--beam-size", str(settings["beam_size"]),
            "--alpha", str(settings["alpha"]), "--max-extra-length", str(settings["max_extra_length"]),
            "--threads", str(threads), "--port", str(port)]


class Server:
    """A server process, its output in `log`; `start()` returns its
    start-up line once `/health` answers."""

    def __init__(self, command, log, backend):
        self.command, self.log, self.process = command, log, None
        self.env = dict(os.environ, KERAS_BACKEND=backend, PYTHONUNBUFFERED="1")

    def start(self, port, timeout):
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=log, stderr=log)
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with status {self.process.returncode}:\n{self.tail()}")
            line = next((line for line in self.lines() if line.startswith("Serving")), None)
            if line and get(port, "/health")[0] == 200:
                return line
            time.sleep(0.2)
        raise RuntimeError(f"not ready after {timeout} s:\n{self.tail()}")

    def lines(self):
        with open(self.log, errors="replace") as file:
            return file.read().splitlines()

    def tail(self, count=15):
        return "\n".join(self.lines()[-count:])

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # both answer what they accepted, then exit
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def get(port, path):
    """`(status, body)`, or `(None, "")` if nothing answers."""
    connection = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return None, ""
    finally:
        connection.close()


def batch_counters(port):
    """Ours' decoded batches so far: (count, sentences), from `/metrics`."""
    status, text = get(port, "/metrics")
    found = dict(re.findall(r"^translate_batch_sentences_(sum|count)\{[^}]*\} (\S+)$", text, re.MULTILINE))
    return (float(found.get("count", 0)), float(found.get("sum", 0))) if status == 200 else None


# The clients -----------------------------------------------------------------------


def post(connection, text):
    body = json.dumps({"q": text, "source": "en", "target": "de"})
    connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read()


def load(port, sentences, concurrency, requests, max_seconds):
    """`requests` requests, sentence i % len(sentences) the i-th, from
    `concurrency` threads; stops sending at `max_seconds`, and no request
    waits past it. Returns (wall seconds, [(seconds, status, body) or None
    if unsent, by request]); status "cut": the deadline came first."""
    results, lock, order = [None] * requests, threading.Lock(), iter(range(requests))
    start = time.perf_counter()
    deadline = start + max_seconds

    def client():
        connection = http.client.HTTPConnection(HOST, port, timeout=max_seconds)
        try:
            while True:
                with lock:
                    i = next(order, None)
                remaining = deadline - time.perf_counter()
                if i is None or remaining <= 0:
                    return
                connection.timeout = remaining
                if connection.sock is not None:
                    connection.sock.settimeout(remaining)
                sent = time.perf_counter()
                try:
                    status, body = post(connection, sentences[i % len(sentences)])
                except TimeoutError:  # the deadline came first
                    status, body = "cut", b""
                    connection.close()
                except (OSError, http.client.HTTPException) as error:
                    status, body = None, repr(error).encode()
                    connection.close()
                results[i] = (time.perf_counter() - sent, status, body)
        finally:
            connection.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, results


def cell_requests(args, concurrency):
    """A cell's requests: `--requests`, and `--rounds` for each client."""
    return max(args.requests, args.rounds * concurrency)


def cell(port, sentences, concurrency, args, expected_tokens, batches_of):
    """One server at one concurrency: the row of the report."""
    before = batches_of(port)
    wall, results = load(port, sentences, concurrency, cell_requests(args, concurrency), args.max_seconds)
    after = batches_of(port)
    answered = [(seconds, json.loads(body)) for seconds, status, body in filter(None, results) if status == 200]
    failures = [body.decode(errors="replace")[:200] for seconds, status, body in filter(None, results)
                if status not in (200, "cut")]
    milliseconds = [1000 * seconds for seconds, _ in answered]
    # The CTranslate2 server says how many pieces it read and decoded: ours' pieces, and their limit.
    wrong_lengths = [i for i, result in enumerate(results) if result and result[1] == 200
                     and "tokens" in (reply := json.loads(result[2]))
                     and (reply["source_tokens"], reply["tokens"]) != expected_tokens[i]]
    row = {
        "concurrency": concurrency, "requests": len(results), "answered": len(answered),
        "unsent": results.count(None), "cut": sum(1 for result in results if result and result[1] == "cut"),
        "failures": len(failures), "first_failure": failures[0] if failures else None,
        "timed_out": wall >= args.max_seconds and len(answered) < len(results), "wall_seconds": wall,
        "sentences_per_second": len(answered) / wall, "wrong_lengths": len(wrong_lengths),
        "milliseconds": milliseconds,
    }
    if milliseconds:
        p50, p95, p99 = (float(p) for p in np.percentile(milliseconds, [50, 95, 99]))
        row.update(p50_ms=p50, p95_ms=p95, p99_ms=p99, p99_over_p50=p99 / p50, mean_ms=float(np.mean(milliseconds)))
    if before is not None and after is not None and after[0] > before[0]:
        row["sentences_per_batch"] = (after[1] - before[1]) / (after[0] - before[0])
    return row


def measure(name, models, sentences, expected_tokens, args, backend, work):
    """Starts `name`, sends its warm-up, runs its cells, stops it."""
    port = free_port()
    server = Server(server_command(name, models, port, args.threads, args.no_warm_up, args.max_source_length), os.path.join(work, f"{name}.log"), backend)
    report = {"command": " ".join(server.command), "cells": {}}
    try:
        started = time.perf_counter()
        try:
            report["ready"] = server.start(port, args.start_seconds)
        except RuntimeError as error:
            report["failed"] = f"{name} did not start: {error}"
            print(report["failed"], file=sys.stderr, flush=True)
            return report
        report["start_seconds"] = time.perf_counter() - started
        print(f"{name}: {report['ready']} (ready after {report['start_seconds']:.1f} s)", flush=True)
        for i in range(args.warm_up):
            wall, (result,) = load(port, sentences[i:], 1, 1, args.max_seconds)
            if result is None or result[1] != 200:
                report["failed"] = f"{name}'s warm-up request {i + 1} failed: {result}"
                print(report["failed"], file=sys.stderr, flush=True)
                return report
        batches_of = batch_counters if name.startswith("ours") else (lambda port: None)
        for concurrency in args.concurrency:
            time.sleep(args.settle)  # no thread pool still spinning from the last cell
            row = cell(port, sentences, concurrency, args, expected_tokens, batches_of)
            report["cells"][str(concurrency)] = row
            print(f"  c={concurrency:<3d} {row['sentences_per_second']:7.2f} sentences/s"
                  + (f", p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms" if "p50_ms" in row else "")
                  + (f", {row['sentences_per_batch']:.1f} sentences a batch" if "sentences_per_batch" in row else "")
                  + (f"; {row['failures']} failed: {row['first_failure']}" if row["failures"] else "")
                  + (f"; {row['wrong_lengths']} with the wrong length" if row["wrong_lengths"] else ""),
                  flush=True)
            if row["timed_out"]:
                report["stopped"] = f"c={concurrency} passed --max-seconds {args.max_seconds}; later cells skipped"
                print(f"  {report['stopped']}", flush=True)
                break
    finally:
        server.stop()
        report["log_tail"] = server.tail(5)
    return report


# The report ------------------------------------------------------------------------


def ratios(servers):
    def at(name, concurrency, key):
        return servers.get(name, {}).get("cells", {}).get(str(concurrency), {}).get(key)

    found = {}
    for peer in ("ours-unbatched", "ctranslate2"):
        ours, other = at("ours", 32, "sentences_per_second"), at(peer, 32, "sentences_per_second")
        if ours and other:
            found[f"ours/{peer} throughput, c=32"] = ours / other
    if at("ours", 1, "p99_over_p50") is not None:
        found["ours p99/p50, c=1"] = at("ours", 1, "p99_over_p50")
    return {name: {"value": value, "target": f"{TARGETS[name][0]} {TARGETS[name][1]}",
                   "met": value >= TARGETS[name][1] if TARGETS[name][0] == ">=" else value <= TARGETS[name][1]}
            for name, value in found.items()}


def print_report(results):
    print(f"\n{results['size']}'s size, {results['backend']}, {results['machine']}: {results['requests']} requests "
          f"a cell and at least {results['rounds']} a client, beam {results['settings']['beam_size']}, "
          f"source pieces + {results['settings']['max_extra_length']} "
          f"tokens each ({results['source_pieces']['min']} to {results['source_pieces']['max']} source pieces, "
          f"median {results['source_pieces']['median']:g})")
    print("| server | concurrency | sentences/s | p50 ms | p95 ms | p99 ms | p99/p50 | sentences a batch | note |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, server in results["servers"].items():
        if "failed" in server and not server["cells"]:
            print(f"| {name} | | | | | | | | {server['failed'].splitlines()[0][:120]} |")
        for concurrency, row in server["cells"].items():
            numbers = " | ".join(f"{row[key]:.0f}" if key in row else "" for key in ("p50_ms", "p95_ms", "p99_ms"))
            ratio = f"{row['p99_over_p50']:.2f}" if "p99_over_p50" in row else ""
            batch = f"{row['sentences_per_batch']:.1f}" if "sentences_per_batch" in row else ""
            notes = [f"{row['failures']} failed" if row["failures"] else "",
                     f"only {row['requests']} in flight" if row["requests"] < row["concurrency"] else "",
                     f"passed --max-seconds ({row['answered']} answered)" if row["timed_out"] else "",
                     f"{row['wrong_lengths']} wrong lengths" if row["wrong_lengths"] else ""]
            print(f"| {name} | {concurrency} | {row['sentences_per_second']:.2f} | {numbers} | {ratio} | {batch} "
                  f"| {'; '.join(filter(None, notes))} |")
    if results["ratios"]:
        print("\n| target | value | wanted | met |\n| --- | ---: | --- | --- |")
        for name, ratio in results["ratios"].items():
            print(f"| {name} | {ratio['value']:.2f} | {ratio['target']} | {'yes' if ratio['met'] else 'no'} |")
    for name, server in results["servers"].items():
        print(f"{name}: {server['ready'] if 'ready' in server else server['failed'].splitlines()[0]}")
    sys.stdout.flush()


# the sentence splitters (--splitters) --------------------------------------------------

WMT = os.path.join(os.path.dirname(LATENCY_SOURCE), "..", "wmt14")
SPLITTERS = ["pysbd", "sentencex", "syntok"]
SENTENCES_PER_PARAGRAPH = 5


def splitters(names):
    """{name: split(language, paragraph) -> [sentence]}."""
    found = {}
    if "pysbd" in names:
        import pysbd

        segmenters = {}

        def split_pysbd(language, text):
            if language not in segmenters:
                segmenters[language] = pysbd.Segmenter(language=language, clean=False)
            return segmenters[language].segment(text)

        found["pysbd"] = split_pysbd
    if "sentencex" in names:
        import sentencex

        found["sentencex"] = lambda language, text: list(sentencex.segment(language, text))
    if "syntok" in names:
        import syntok.segmenter

        def split_syntok(language, text):
            return ["".join(token.spacing + token.value for token in sentence)
                    for paragraph in syntok.segmenter.analyze(text) for sentence in paragraph]

        found["syntok"] = split_syntok
    return found


def paragraphs(path, size, count):
    """`count` paragraphs of `size` consecutive lines: (text, lines)."""
    with open(path, encoding="utf-8") as file:
        lines = [line.strip() for line in file if line.strip()]
    groups = [lines[i : i + size] for i in range(0, size * count, size)]
    return [(" ".join(group), group) for group in groups if len(group) == size]


def boundaries(sentences):
    """The end of each sentence but the last, counted in non-space characters."""
    ends, seen = set(), 0
    for sentence in sentences[:-1]:
        seen += len("".join(sentence.split()))
        ends.add(seen)
    return ends


def splitter_score(split, language, found_paragraphs):
    true_found = found = true = exact = 0
    for text, lines in found_paragraphs:
        pieces = [piece for piece in split(language, text) if piece.strip()]
        got, wanted = boundaries(pieces), boundaries(lines)
        true_found += len(got & wanted)
        found += len(got)
        true += len(wanted)
        exact += [piece.strip() for piece in pieces] == lines
    return {"precision": true_found / found, "recall": true_found / true, "exact": exact / len(found_paragraphs)}


def splitter_speed(split, language, found_paragraphs, rounds):
    sentences = sum(len(lines) for _, lines in found_paragraphs)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for text, _ in found_paragraphs:
            split(language, text)
        best = min(best, time.perf_counter() - start)
    return sentences / best


def compare_splitters(args):
    """`--splitters`: each splitter's precision, recall, exact paragraphs
    and speed, by test set and language."""
    rows = []
    for name, split in splitters(SPLITTERS).items():
        for test_set in ("newstest2013", "newstest2014"):
            for language in ("en", "de"):
                found = paragraphs(os.path.join(args.wmt, f"{test_set}.{language}"), SENTENCES_PER_PARAGRAPH,
                                   args.paragraphs)
                row = {"splitter": name, "test_set": test_set, "language": language, "paragraphs": len(found)}
                row.update(splitter_score(split, language, found))
                row["sentences_per_second"] = splitter_speed(split, language, found, rounds=3)
                rows.append(row)
                print(f"{name:10} {test_set} {language}  precision {row['precision']:.4f}  recall "
                      f"{row['recall']:.4f}  exact {row['exact']:.3f}  {row['sentences_per_second']:,.0f} sentences/s",
                      flush=True)
    if args.json:
        from importlib.metadata import version

        from keras_transformer import environment

        header = {"command": " ".join(["python"] + sys.argv), "machine": environment.describe_machine(),
                  "versions": {name: version(name) for name in SPLITTERS}}
        with open(args.json, "w") as file:
            json.dump({"header": header, "rows": rows}, file, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="opus-mt-en-de", choices=sorted(CONVERTED_SIZES))
    parser.add_argument("--servers", nargs="+", default=SERVERS, choices=SERVERS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=64, help="timed requests per cell")
    parser.add_argument("--rounds", type=int, default=4, help="timed requests per client at least: a cell sends "
                        "max(--requests, rounds x concurrency)")
    parser.add_argument("--warm-up", type=int, default=4, help="untimed requests, one at a time, before the cells")
    parser.add_argument("--max-seconds", type=float, default=600, help="a cell's time at most")
    parser.add_argument("--start-seconds", type=float, default=3600, help="a server's start-up (its warm-up) at most")
    parser.add_argument("--settle", type=float, default=1.0, help="idle seconds before each cell")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2's intra_threads")
    parser.add_argument("--spm-vocab", type=int, default=4000, help="pieces of the SentencePiece model of Multi30k")
    parser.add_argument("--sentences", default=LATENCY_SOURCE, help="the requests' sentences, one a line "
                        "(default: Multi30k's test2016.en, in ../shared/data)")
    parser.add_argument("--work-dir", help="where the models and server logs go, kept (default: a temporary "
                        "folder, removed)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--max-source-length", type=int, default=48, help="ours' serve --max-source-length: the "
                        "shapes it compiles (Multi30k's test sentences have at most 35 pieces and EOS)")
    parser.add_argument("--no-warm-up", action="store_true", help="ours compiles each shape when first met (smoke runs: "
                        "the figures then include compiles)")
    parser.add_argument("--splitters", action="store_true", help="instead of the load: the sentence splitters compared")
    parser.add_argument("--paragraphs", type=int, default=600, help="--splitters' paragraphs of each test set and language")
    parser.add_argument("--wmt", default=WMT, help="--splitters' folder of newstest2013 and newstest2014 (.en, .de; "
                        "default: ../shared/data/wmt14)")
    parser.add_argument("--max-extra-length", type=int, help="the tokens each sentence decodes past its source "
                        "pieces (default: the converted translator's; fewer for smoke runs)")
    parser.add_argument("--train-source", default=TRAIN_SOURCE, help="the text the SentencePiece model is trained on "
                        "(default: Multi30k's train.en, in ../shared/data)")
    args = parser.parse_args()
    if args.splitters:
        return compare_splitters(args)
    if min(args.concurrency) < 1 or args.requests < 1 or args.rounds < 1 or args.warm_up < 0 or args.max_seconds <= 0:
        parser.error("--concurrency and --requests and --rounds must be >= 1, --warm-up >= 0, --max-seconds > 0")
    for path in (args.sentences, args.train_source):
        if not os.path.isfile(path):
            parser.error(f"{path} is not a file; this tool reads Multi30k from ../shared/data")
    # A stopped run stops its server (`measure`'s finally).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    import keras

    from keras_transformer import environment

    backend = keras.backend.backend()
    keras.utils.set_random_seed(0)
    work = args.work_dir or tempfile.mkdtemp(prefix="serve_load_")
    os.makedirs(work, exist_ok=True)
    try:
        began = time.perf_counter()
        sentences = read_sentences(args.sentences)
        models = build_models(args.size, args.spm_vocab, work, args.train_source, args.max_extra_length)
        settings = models["settings"]
        pieces = source_lengths(models, sentences)
        used = [pieces[i % len(pieces)] for i in range(max(cell_requests(args, c) for c in args.concurrency))]
        expected_tokens = [(n, n + settings["max_extra_length"]) for n in used]
        check_ours_decodes_to_limit(models["translator"], sentences[0])
        print(f"models ready in {time.perf_counter() - began:.0f} s: {settings}", flush=True)
        del models["translator"]
        results = {
            "command": " ".join([f"KERAS_BACKEND={backend}", "python"] + sys.argv),
            "machine": environment.describe_machine(), "backend": backend,
            "versions": versions(backend), "size": args.size,
            "model": {key: models["size"][key] for key in ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
                                                          "encoder_ffn_dim", "encoder_attention_heads")},
            "settings": settings, "spm_vocab": args.spm_vocab, "sentences": os.path.abspath(args.sentences),
            "source_pieces": {"min": min(used), "median": float(np.median(used)), "max": max(used)},
            "requests": args.requests, "rounds": args.rounds, "warm_up": args.warm_up, "concurrency": args.concurrency,
            "max_seconds": args.max_seconds, "ctranslate2_threads": args.threads, "servers": {},
        }
        for name in args.servers:
            results["servers"][name] = measure(name, models, sentences, expected_tokens, args, backend, work)
        results["ratios"] = ratios(results["servers"])
        results["seconds"] = time.perf_counter() - began
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print_report(results)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)
    bad = [name for name, server in results["servers"].items() if "failed" in server] + [
        name for name, server in results["servers"].items()
        if any(row["failures"] or row["wrong_lengths"] for row in server["cells"].values())]
    if bad:
        sys.exit(f"error: {', '.join(sorted(set(bad)))}: failed requests, wrong lengths or no start; see above")


def versions(backend):
    from importlib.metadata import version

    names = ["keras", {"jax": "jax", "torch": "torch", "tensorflow": "tensorflow"}.get(backend, backend),
             "ctranslate2", "starlette", "uvicorn", "transformers", "sentencepiece"]
    return {name: version(name) for name in dict.fromkeys(names)}


if __name__ == "__main__":
    main()
