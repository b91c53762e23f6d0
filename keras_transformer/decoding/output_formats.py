"""What `translate` writes for each source line: its translation, or its
n-best list with scores, as text, tab-separated values or JSON lines.

Each source line gives one record of a fixed number of lines (one per
hypothesis for `text` and `tsv`, one for `jsonl`), so that an interrupted
output is continued where its last whole record ends
(`streaming.translate_file`).
"""

import json

OUTPUT_FORMATS = ("text", "tsv", "jsonl")


def check_output(n_best, output_format, with_scores):
    if isinstance(n_best, bool) or not isinstance(n_best, int) or n_best < 1:
        raise ValueError(f"n_best must be an integer >= 1. Received: n_best={n_best!r}")
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"output_format must be one of {list(OUTPUT_FORMATS)}. Received: output_format={output_format!r}")
    if with_scores and output_format != "text":
        raise ValueError(f"--with-scores adds scores to text output; {output_format} always has them.")


class FormattedLines:
    """`streaming.translate_file`'s translator for `translate --n-best N`,
    `--with-scores` and `--output-format`: a record for each source line.

    - `text`: N lines, the hypotheses best first; with `with_scores`, each
      `SCORE<TAB>TRANSLATION`.
    - `tsv`: N lines, `LINE<TAB>RANK<TAB>SCORE<TAB>TRANSLATION`, the line
      counted from 1 in the input and the rank from 1.
    - `jsonl`: one JSON object, `{"line", "translation", "score",
      "alternatives": [{"translation", "score"}, ...]}`, the alternatives
      the other N - 1 hypotheses.

    A score is the search's: log P divided by the length penalty for a beam
    search, log P for greedy search and sampling (`Translator.n_best`). A
    blank source line's hypotheses are "" with score 0.
    """

    def __init__(self, translator, n_best=1, output_format="text", with_scores=False):
        check_output(n_best, output_format, with_scores)
        translator.check_n_best(n_best)
        self.translator = translator
        self.n_best = n_best
        self.output_format = output_format
        self.with_scores = with_scores
        self.lines_per_record = 1 if output_format == "jsonl" else n_best

    def get_config(self):
        return self.translator.get_config() | {
            "n_best": self.n_best, "output_format": self.output_format, "with_scores": self.with_scores}

    def translate(self, texts, first_line=0):
        found = self.translator.n_best(texts, first_line, count=self.n_best)
        return [self.record(first_line + i + 1, hypotheses) for i, hypotheses in enumerate(found)]

    def record(self, line, hypotheses):
        """The record of source line `line` (from 1): its lines, joined by
        newlines, each without one of its own."""
        hypotheses = [(_one_line(text), score) for text, score in hypotheses]
        hypotheses += [("", 0.0)] * (self.n_best - len(hypotheses))  # a blank line's one
        if self.output_format == "jsonl":
            (best, score), *others = hypotheses
            return json.dumps({
                "line": line, "translation": best, "score": round(score, 6),
                "alternatives": [{"translation": text, "score": round(value, 6)} for text, value in others],
            }, ensure_ascii=False)
        if self.output_format == "tsv":
            return "\n".join(f"{line}\t{rank}\t{score:.6f}\t{text}" for rank, (text, score) in enumerate(hypotheses, 1))
        if self.with_scores:
            return "\n".join(f"{score:.6f}\t{text}" for text, score in hypotheses)
        return "\n".join(text for text, _ in hypotheses)


def _one_line(text):
    return text.replace("\n", " ").replace("\r", " ")
