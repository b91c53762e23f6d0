"""Translators by language pair, behind their batchers: texts in,
translations out, line by line.

A text keeps its lines: each non-blank line is a sentence to decode, and
blank lines (paragraph breaks) stay where they were. A line longer than the
translator's `max_source_length` is decoded in pieces of that many tokens,
joined, and the answer says so: nothing is cut silently.
"""

import asyncio
import dataclasses

from keras_transformer.data.languages import name_of
from keras_transformer.serving.batcher import Batcher


class UnknownPair(ValueError):
    """No translator here translates the pair a request names."""


@dataclasses.dataclass
class Served:
    translator: object
    batcher: Batcher
    directory: str


class Service:
    """The translators a server serves, by `(source, target)` pair.

    Args:
        translators: `{(source, target): (translator, directory)}`.
        metrics: the server's `Metrics`.
        **batching: `Batcher`'s `max_tokens`, `max_wait` and `max_queue`.
    """

    def __init__(self, translators, metrics, **batching):
        if not translators:
            raise ValueError("A service needs at least one translator.")
        self.metrics = metrics
        self.models = {}
        for pair, (translator, directory) in translators.items():
            batcher = Batcher(translator, metrics=metrics.for_pair("-".join(pair)), **batching)
            metrics.queues["-".join(pair)] = lambda batcher=batcher: batcher.depth
            self.models[tuple(pair)] = Served(translator, batcher, directory)

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

    def start(self):
        for served in self.models.values():
            served.batcher.start()

    async def stop(self):
        await asyncio.gather(*(served.batcher.stop() for served in self.models.values()))

    async def translate(self, texts, source, target):
        """Each text's translation, its lines kept.

        Returns:
            `(translations, warnings)`: a string for each text, and a
            sentence for each line that was decoded in pieces.
        """
        served = self.served(source, target)
        translator = served.translator
        lines = [text.split("\n") for text in texts]
        wanted = [(i, j) for i, text_lines in enumerate(lines) for j, line in enumerate(text_lines) if line.strip()]
        # Tokenizing a long text takes a while: off the event loop.
        tokenized = await asyncio.to_thread(translator.tokenizer.tokenize, [lines[i][j] for i, j in wanted])
        longest = translator.max_source_length - 1  # and EOS
        pieces, owners, warnings = [], [], []
        for (i, j), ids in zip(wanted, tokenized):
            if len(ids) > longest:
                count = -(-len(ids) // longest)
                warnings.append(
                    f"texts[{i}] line {j + 1} has {len(ids)} tokens, more than the model's "
                    f"{longest}; it was translated in {count} pieces"
                )
            for start in range(0, len(ids), longest):
                pieces.append(ids[start : start + longest] + [translator.tokenizer.eos_id])
                owners.append((i, j))
        found = await served.batcher.search(pieces) if pieces else []
        best = translator.detokenize([ids[0].tolist() for ids, _ in found])
        translated = {}
        for owner, text in zip(owners, best):
            translated.setdefault(owner, []).append(text)
        results = [
            "\n".join(" ".join(translated[i, j]) if (i, j) in translated else "" for j in range(len(text_lines)))
            for i, text_lines in enumerate(lines)
        ]
        return results, warnings
