"""Translators by language pair, behind their batchers: texts in,
translations out, line by line.

A text keeps its lines: each non-blank line is a sentence to decode, and
blank lines (paragraph breaks) stay where they were. A line longer than the
translator's `max_source_length` is decoded in pieces of that many tokens,
joined, and the answer says so: nothing is cut silently.
"""

import asyncio
import concurrent.futures
import dataclasses
import time

from keras_transformer.data.languages import name_of
from keras_transformer.data.sentences import joined
from keras_transformer.data.sentences import sources_in_pieces
from keras_transformer.data.sentences import split_text
from keras_transformer.serving.batcher import Batcher


class UnknownPair(ValueError):
    """No translator here translates the pair a request names."""


class Refused(ValueError):
    """A request asks for more than the service gives: too many sentences,
    a beam size not served, more hypotheses than the beam keeps."""


@dataclasses.dataclass
class Served:
    translator: object
    batchers: dict  # beam size -> the Batcher of the translator with that beam
    directory: str


class Service:
    """The translators a server serves, by `(source, target)` pair.

    One thread decodes for every translator (the backend's own threads use
    every core); each translator has a `Batcher` for each beam size served.

    Args:
        translators: `{(source, target): (translator, directory)}`.
        metrics: the server's `Metrics`.
        beam_sizes: beam sizes a request may ask for, besides each
            translator's own (each is compiled at warm-up).
        **batching: `Batcher`'s `max_tokens`, `max_wait`, `max_queue` and
            `across_requests`.
    """

    def __init__(self, translators, metrics, beam_sizes=(), **batching):
        if not translators:
            raise ValueError("A service needs at least one translator.")
        for size in beam_sizes:
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"beam sizes must be integers >= 1. Received: {list(beam_sizes)!r}")
        self.metrics = metrics
        self.models = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="translate")
        for pair, (translator, directory) in translators.items():
            name = "-".join(pair)
            batchers = {}
            for size in sorted({translator.beam_size, *beam_sizes}):
                searching = translator if size == translator.beam_size else translator.with_search(beam_size=size)
                batchers[size] = Batcher(
                    searching, metrics=metrics.for_pair(name), executor=self._executor, **batching
                )
            metrics.queues[name] = lambda batchers=batchers: sum(b.depth for b in batchers.values())
            self.models[tuple(pair)] = Served(translator, batchers, directory)

    def pairs(self):
        return ", ".join(f"{source}-{target}" for source, target in self.models)

    def languages(self):
        """LibreTranslate's `/languages`: each language with the ones it
        translates into."""
        targets = {}
        for source, target in self.models:
            targets.setdefault(source, []).append(target)
            targets.setdefault(target, [])
        return [{"code": code, "name": name_of(code), "targets": sorted(found)} for code, found in sorted(targets.items())]

    def served(self, source, target):
        if (source, target) not in self.models:
            raise UnknownPair(f"No model here translates {source!r} into {target!r}. Pairs served: {self.pairs()}")
        return self.models[source, target]

    def batcher(self, served, beam_size=None):
        """The batcher of `served`'s translator with `beam_size`."""
        size = served.translator.beam_size if beam_size is None else beam_size
        if size not in served.batchers:
            raise Refused(
                f"beam_size {beam_size!r} is not served; this server decodes with beam sizes "
                f"{sorted(served.batchers)} (serve --beam-sizes adds others)"
            )
        return served.batchers[size]

    def warm_up(self):
        """Compiles every shape each batcher's translator decodes.

        Returns:
            `(programs, seconds)`.
        """
        programs, start = 0, time.perf_counter()
        for served in self.models.values():
            for batcher in served.batchers.values():
                programs += batcher.translator.warm_up()[0]
        return programs, time.perf_counter() - start

    def start(self):
        for served in self.models.values():
            for batcher in served.batchers.values():
                batcher.start()

    async def stop(self):
        await asyncio.gather(*(b.stop() for served in self.models.values() for b in served.batchers.values()))
        self._executor.shutdown(wait=True)

    async def translate(self, texts, source, target, beam_size=None, n_best=None, split_sentences=True,
                        max_sentences=None):
        """Each text's translation, its lines and spacing kept.

        Args:
            texts: strings.
            source, target: the pair's language codes.
            beam_size: None for the translator's own, or one of the
                beam sizes served.
            n_best: None, or how many hypotheses of each sentence to give,
                with their scores (at most the beam size).
            split_sentences: translate sentence by sentence (False: line
                by line).
            max_sentences: the most sentences the texts may hold, or None.

        Returns:
            `(translations, sentences, warnings)`: a string for each text;
            None, or for each text a list of its sentences' `(source,
            [(translation, score)] best first)`, with `n_best`; and a line
            for each sentence decoded in pieces.
        """
        served = self.served(source, target)
        batcher = self.batcher(served, beam_size)
        if n_best is not None and not (isinstance(n_best, int) and 1 <= n_best <= batcher.translator.beam_size):
            raise Refused(f"n_best must be an integer from 1 to the beam size, {batcher.translator.beam_size}. Received: {n_best!r}")
        translator = served.translator
        def split_and_tokenize():
            layouts = [split_text(text, source, sentences=split_sentences) for text in texts]
            sentences = [sentence for layout in layouts for sentence in layout.sentences]
            if max_sentences is not None and len(sentences) > max_sentences:
                raise Refused(f"The texts hold {len(sentences):,} sentences; this server takes at most {max_sentences:,} a request.")
            return layouts, sentences, translator.tokenizer.tokenize(sentences) if sentences else []

        # Splitting and tokenizing a long text takes a while: off the event loop, in one hop.
        layouts, sentences, tokenized = await asyncio.to_thread(split_and_tokenize)
        sources, owners, split = sources_in_pieces(tokenized, translator.max_source_length - 1, translator.tokenizer.eos_id)
        text_of = [i for i, layout in enumerate(layouts) for _ in layout.sentences]
        warnings = [
            f"texts[{text_of[index]}] has a sentence of {tokens} tokens, more than the model's "
            f"{translator.max_source_length - 1}; it was translated in {count} pieces"
            for index, tokens, count in split
        ]
        found = await batcher.search(sources) if sources else []
        ranks = 1 if n_best is None else n_best
        # One detokenizer call: the first `ranks` hypotheses of every piece.
        texts_found = iter(translator.detokenize([row for ids, _ in found for row in ids[:ranks].tolist()]))
        by_rank = [[next(texts_found) for _ in range(ranks)] for _ in found]
        best = iter(joined([hypotheses[0] for hypotheses in by_rank], owners, len(sentences)))
        results = [layout.join([next(best) for _ in layout.sentences]) for layout in layouts]
        if n_best is None:
            return results, None, warnings
        # A sentence in pieces: its r-th hypothesis joins its pieces' r-th, scores summed.
        hypotheses = [[("", 0.0)] * ranks for _ in sentences]
        for owner, piece_texts, (_, scores) in zip(owners, by_rank, found):
            hypotheses[owner] = [
                ((text + " " + piece).strip(), score + float(piece_score))
                for (text, score), piece, piece_score in zip(hypotheses[owner], piece_texts, scores)
            ]
        details = [[] for _ in texts]
        for index, sentence in enumerate(sentences):
            details[text_of[index]].append((sentence, hypotheses[index]))
        return results, details, warnings
