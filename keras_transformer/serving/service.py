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

import numpy as np

from keras_transformer.data.languages import name_of
from keras_transformer.data.sentences import joined
from keras_transformer.data.sentences import sources_in_pieces
from keras_transformer.data.sentences import split_text
from keras_transformer.serving.batcher import Batcher


class UnknownPair(ValueError):
    """No translator here translates the pair a request names."""


class Refused(ValueError):
    """A request asks for more than the service gives: too many sentences,
    a beam size not served, more hypotheses than the beam keeps, search
    settings that are wrong or one set too many."""


# The search settings a request may set (`SearchSettings` fields); the
# output limit stays the translator's, which the request limits count on.
REQUEST_SETTINGS = ("beam_size", "alpha", "length_penalty", "min_length", "repetition_penalty",
                    "no_repeat_ngram_size", "sampling", "temperature", "seed")
# Search settings a pair keeps batchers for: each is compiled when first asked for.
MAX_SEARCHES = 16


@dataclasses.dataclass
class Served:
    translator: object
    batchers: dict  # SearchSettings -> the Batcher of the translator searching so
    directory: str
    beam_sizes: tuple  # the beam sizes served, each compiled at warm-up


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
        self.batching = batching
        self.models = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="translate")
        for pair, (translator, directory) in translators.items():
            name = "-".join(pair)
            sizes = tuple(sorted({translator.beam_size, *beam_sizes}))
            served = self.models[tuple(pair)] = Served(translator, {}, directory, sizes)
            for size in sizes:
                self._new_batcher(served, translator if size == translator.beam_size else translator.with_search(beam_size=size))
            metrics.queues[name] = lambda batchers=served.batchers: sum(b.depth for b in list(batchers.values()))

    def _new_batcher(self, served, translator):
        name = "-".join(next(pair for pair, known in self.models.items() if known is served))
        batcher = served.batchers[translator.search_settings] = Batcher(
            translator, metrics=self.metrics.for_pair(name), executor=self._executor, **self.batching
        )
        return batcher

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

    def batcher(self, served, search=None):
        """The batcher of `served`'s translator with the search settings
        `search` (a dict of `REQUEST_SETTINGS`): a beam size served, and
        other settings, whose batcher is made (and its search compiled)
        when they are first asked for."""
        search = dict(search or {})
        unknown = sorted(set(search) - set(REQUEST_SETTINGS))
        if unknown:
            raise Refused(f"A request may set the search settings {list(REQUEST_SETTINGS)}. Received: {unknown}")
        size = search.get("beam_size")
        if size is not None and size not in served.beam_sizes:
            raise Refused(
                f"beam_size {size!r} is not served; this server decodes with beam sizes "
                f"{list(served.beam_sizes)} (serve --beam-sizes adds others)"
            )
        try:
            settings = served.translator.search_settings.replace(**search)
        except (TypeError, ValueError) as error:
            raise Refused(str(error)) from None
        if settings not in served.batchers:
            if len(served.batchers) >= MAX_SEARCHES:
                raise Refused(f"This server keeps {MAX_SEARCHES} search settings per pair, all in use; "
                              "ask with settings another request used.")
            self._new_batcher(served, served.translator.with_search(**search)).start()
        return served.batchers[settings]

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

    async def translate(self, texts, source, target, search=None, n_best=None, split_sentences=True,
                        max_sentences=None):
        """Each text's translation, its lines and spacing kept.

        Args:
            texts: strings.
            source, target: the pair's language codes.
            search: None for the translator's own search, or a dict of
                `REQUEST_SETTINGS` (a beam size served, and others).
            n_best: None, or how many hypotheses of each sentence to give,
                with their scores (at most the beam size; samples, with
                `sampling`).
            split_sentences: translate sentence by sentence (False: line
                by line).
            max_sentences: the most sentences the texts may hold, or None.

        Returns:
            `(translations, sentences, warnings, alternatives)`: a string
            for each text; None, or for each text a list of its sentences'
            `(source, [(translation, score)] best first)`, with `n_best`; a
            line for each sentence decoded in pieces; and None, or for each
            text its other `n_best - 1` translations, from its sentences'
            hypotheses of each rank.
        """
        served = self.served(source, target)
        batcher = self.batcher(served, search)
        try:
            batcher.translator.check_n_best(n_best)
        except ValueError as error:
            raise Refused(str(error)) from None
        translator = served.translator
        # A sentence's samples are rows of their own (`Translator.n_best`).
        draws = n_best if batcher.translator.sampling and n_best else 1
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
        found = await batcher.search([ids for ids in sources for _ in range(draws)]) if sources else []
        if draws > 1:
            found = [_drawn(found[i * draws : (i + 1) * draws]) for i in range(len(sources))]
        ranks = 1 if n_best is None else n_best
        # One detokenizer call: the first `ranks` hypotheses of every piece.
        texts_found = iter(translator.detokenize([row for ids, _ in found for row in ids[:ranks].tolist()]))
        by_rank = [[next(texts_found) for _ in range(ranks)] for _ in found]
        best = iter(joined([hypotheses[0] for hypotheses in by_rank], owners, len(sentences)))
        results = [layout.join([next(best) for _ in layout.sentences]) for layout in layouts]
        if n_best is None:
            return results, None, warnings, None
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
        # A text's r-th alternative: its sentences' r-th hypotheses, in its layout.
        alternatives = [
            [layout.join([found_hypotheses[rank][0] for _, found_hypotheses in mine]) for rank in range(1, ranks)]
            for layout, mine in zip(layouts, details)
        ]
        return results, details, warnings, alternatives


def _drawn(samples):
    """One `(ids, scores)` of a sentence's samples, each `(ids, scores)` of
    one row: the samples best first."""
    order = sorted(range(len(samples)), key=lambda i: -float(samples[i][1][0]))
    return np.concatenate([samples[i][0] for i in order]), np.concatenate([samples[i][1] for i in order])
