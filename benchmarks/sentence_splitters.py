"""Sentence splitters for `serve` and `translate --split-sentences`: which
finds the sentences of a paragraph, and how fast.

    pip install pysbd sentencex syntok
    python benchmarks/sentence_splitters.py --json benchmarks/results/sentence_splitters.json

The WMT news test sets hold one sentence per line, in their documents'
order: every `--sentences-per-paragraph` (5) lines, joined by a space, make
a paragraph whose sentences are known. Each splitter splits each paragraph,
in English and in German (newstest2013 and newstest2014, the two sides of
../shared/data/wmt14). Reported for each splitter and language: the
boundaries found that are true (precision) and the true ones found
(recall), the paragraphs split exactly into their lines, and sentences per
second (the best of `--rounds`, on one core).

The splitters, all rule-based, pure Python or native, multilingual, and
installed from PyPI:
- `pysbd`: the Pragmatic Segmenter's rules, 22 languages;
- `sentencex`: Wikimedia's, a native library, with rules and abbreviation
  lists for many languages and fallback chains for the rest;
- `syntok` (asked for by name): a tokenizer with segmentation for English,
  German and Spanish.
"""

import argparse
import json
import os
import sys
import time

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "wmt14")


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


def score(split, language, found_paragraphs):
    true_found = found = true = exact = 0
    for text, lines in found_paragraphs:
        pieces = [piece for piece in split(language, text) if piece.strip()]
        got, wanted = boundaries(pieces), boundaries(lines)
        true_found += len(got & wanted)
        found += len(got)
        true += len(wanted)
        exact += [piece.strip() for piece in pieces] == lines
    return {"precision": true_found / found, "recall": true_found / true, "exact": exact / len(found_paragraphs)}


def speed(split, language, found_paragraphs, rounds):
    sentences = sum(len(lines) for _, lines in found_paragraphs)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for text, _ in found_paragraphs:
            split(language, text)
        best = min(best, time.perf_counter() - start)
    return sentences / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splitters", nargs="+", default=["pysbd", "sentencex", "syntok"])
    parser.add_argument("--sentences-per-paragraph", type=int, default=5)
    parser.add_argument("--paragraphs", type=int, default=600, help="of each test set and language")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rows = []
    for name, split in splitters(args.splitters).items():
        for test_set in ("newstest2013", "newstest2014"):
            for language in ("en", "de"):
                path = os.path.join(DATA, f"{test_set}.{language}")
                found = paragraphs(path, args.sentences_per_paragraph, args.paragraphs)
                row = {"splitter": name, "test_set": test_set, "language": language, "paragraphs": len(found)}
                row.update(score(split, language, found))
                row["sentences_per_second"] = speed(split, language, found, args.rounds)
                rows.append(row)
                print(f"{name:10} {test_set} {language}  precision {row['precision']:.4f}  recall "
                      f"{row['recall']:.4f}  exact {row['exact']:.3f}  {row['sentences_per_second']:,.0f} sentences/s",
                      flush=True)
    if args.json:
        from importlib.metadata import version

        header = {"command": " ".join(["python"] + sys.argv), "versions": {name: version(name) for name in args.splitters}}
        with open(args.json, "w") as file:
            json.dump({"header": header, "rows": rows}, file, indent=1)


if __name__ == "__main__":
    main()
