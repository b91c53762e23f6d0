"""Translation: a tokenizer, a trained Transformer and a search, together."""

import functools
import json
import os
import time
import warnings

import keras
import numpy as np

from keras_transformer.data.batches import padded_ids
from keras_transformer.data.pipeline import bucket_lengths
from keras_transformer.data.languages import check_pair
from keras_transformer.data.sentences import check_texts
from keras_transformer.data.sentences import translate_by_sentence
from keras_transformer.data.tokenizers import load_tokenizer
from keras_transformer.decoding.beam_search import sheds
from keras_transformer.decoding import scoring
from keras_transformer.decoding import streaming
from keras_transformer.decoding import translator_directory
from keras_transformer.decoding.compiled import CompiledFunction
from keras_transformer.decoding.search_loop import check_prefix
from keras_transformer.decoding.settings import SearchSettings
from keras_transformer.decoding.steps import search_translations
from keras_transformer.files import save_keras_model
from keras_transformer.files import write_atomically
from keras_transformer.models.config import POSITION_TABLES
from keras_transformer.models.quantization import check_quantization_mode
from keras_transformer.models.quantization import quantized
from keras_transformer.decoding.translator_directory import CONFIG_FILE
from keras_transformer.decoding.translator_directory import MODEL_FILE


class Translator:
    """Translates text with a trained `Transformer` and its tokenizer.

    Sentences are tokenized, sorted by length and decoded in batches of
    similar length, then returned in their original order. The search is
    the paper's (section 6.1): beam search with `beam_size=4`, length
    penalty `alpha=0.6`, at most source length + 50 output tokens, stopping
    when no hypothesis can improve. `beam_size=1` decodes greedily.

    Empty and whitespace-only lines translate to "". Characters the
    vocabulary lacks are spelled in bytes by the tokenizer. A line longer
    than `max_source_length` tokens is cut to that length, with a warning
    that names the line.

    Batches are padded to a few fixed source lengths (`source_lengths`:
    8, 12, 18, 27, 40, 60, 90, 135, 202 and 256 tokens, each about 1.5x
    the one before, so padding stays under a third of a batch) and to a
    power-of-two number of rows, so a compiled backend (JAX, XLA) compiles
    each shape once: at most 10 x 6 programs for `batch_size=32`, whatever
    the sentences. `warm_up` compiles them ahead, so that no sentence waits
    for a compile.

    Args:
        model: a trained `Transformer`.
        tokenizer: its `SubwordTokenizer`, or a converted model's tokenizer
            (`keras_transformer.data.tokenizers`).
        search: the `SearchSettings`; the paper's by default. Each of its
            fields can also be given by name, as `beam_size=1` (greedy
            search), and read as an attribute, as `translator.beam_size`:
            `beam_size`, `alpha` (lp = ((5 + length) / 6)^alpha),
            `length_penalty` ("gnmt", that lp, or "power", lp =
            length^alpha, the penalty of fairseq, Marian and transformers,
            under which their published settings reproduce),
            `max_extra_length` (an output may have this many tokens more
            than its source), `min_length`, `target_prefix` (ids, ours,
            that begin every output, taken before the search takes over:
            a converted NLLB's target language; CTranslate2's
            `target_prefix`) and `force_eos` (end with EOS an output that
            reaches its limit: transformers' `forced_eos_token_id`, set by
            `convert`).
        max_source_length: the most source tokens (EOS included) decoded;
            longer lines are truncated. With learned positions, at most the
            model's `max_length`, which also bounds the outputs.
        batch_size: sentences decoded together, sorted by length: a batch
            costs at most batch_size x (its longest + max_extra_length)
            tokens a beam, in steps and in cache memory, however many
            sentences `translate` is given (the export's `request_cost`).
        jit_compile: compile with XLA under TensorFlow.
        quantize: None, or "int8" to decode with a copy of `model` whose
            attention and feed-forward kernels and token embedding are int8
            (`keras_transformer.models.quantized`); `model` is unchanged.
        warm_up: False; True to compile every shape a batch can take here,
            or a list of row counts (`[1]`: sentences one at a time) to
            compile those (`Translator.warm_up`).
        languages: None, or the `(source, target)` language codes it
            translates between, such as `("en", "de")`: `train` and
            `convert` set them where the files name them, and `serve`
            routes requests by them.
        **search_options: fields of `search` by name, replacing its own.

    Example:
        >>> translator = Translator.load("runs/quickstart")
        >>> translator.translate(["The old man sees the dog."])
        ['Der alte Mann sieht den Hund.']
    """

    def __init__(
        self,
        model,
        tokenizer,
        search=None,
        max_source_length=256,
        batch_size=32,
        jit_compile=False,
        quantize=None,
        warm_up=False,
        languages=None,
        **search_options,
    ):
        for name, value, least in (("max_source_length", max_source_length, 2), ("batch_size", batch_size, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(
                    f"{name} must be an integer >= {least}. Received: {name}={value!r}"
                )
        search = (search or SearchSettings()).replace(**search_options)
        check_quantization_mode(quantize)
        if model.position_encoding in POSITION_TABLES:
            # Learned positions end at the model's max_length, for sources
            # and outputs alike (`search_translations` bounds the outputs).
            max_source_length = min(max_source_length, model.max_length)
        if tokenizer.vocabulary_size != model.vocabulary_size:
            raise ValueError(
                "The tokenizer and the model disagree on the vocabulary: "
                f"tokenizer.vocabulary_size={tokenizer.vocabulary_size}, "
                f"model.vocabulary_size={model.vocabulary_size}"
            )
        self.languages = check_pair(languages)
        check_prefix(search.target_prefix, model.vocabulary_size, search.max_extra_length)
        self.search_settings = search
        # What is made once from this translator: a prefix text or pair ->
        # it with them (`with_target_prefix`, `with_languages`), scorers.
        self.derived = {}
        self.model = quantized(model, quantize) if quantize else model
        self.quantize = quantize
        self.tokenizer = tokenizer
        self.max_source_length = max_source_length
        self.batch_size = batch_size
        self.jit_compile = jit_compile
        self.source_lengths = bucket_lengths(max_source_length, step=1.5)
        # The search of one batch, as a function of its ids, limits and EOS
        # (an input, so that `warm_up` can decode to the limits: under torch
        # each phase of the growing caches is recorded once it is met).
        search_batch = functools.partial(
            search_translations, self.model, settings=search, bos_id=tokenizer.bos_id,
            start_id=getattr(tokenizer, "start_as_id", tokenizer.bos_id),
        )
        self._search = CompiledFunction(
            lambda source_ids, limits, eos_id, *prefix, decoding=None: search_batch(
                source_ids, limits, eos_id=eos_id, forced_ids=prefix[0] if prefix else None, decoding=decoding
            ),
            self.model,
            input_ranks=(2, 1, 0, 2) if self.target_prefix else (2, 1, 0),
            jit_compile=jit_compile,
            # Under torch, every shape's loops: a condition and a body per
            # phase of the growing caches (up to 7) and per half shed, all kept.
            traces=2 * (7 + sheds(batch_size)) * len(self.row_counts()) * len(self.source_lengths),
        )
        if warm_up:
            self.warm_up(None if warm_up is True else warm_up)

    def __getattr__(self, name):
        # The search settings read as the translator's own: `translator.beam_size`.
        if name in SearchSettings.names() and "search_settings" in self.__dict__:
            return getattr(self.search_settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def row_counts(self):
        """The numbers of rows a batch is padded to: 1, 2, 4, ... `batch_size`."""
        counts = [1]
        while counts[-1] < self.batch_size:
            counts.append(min(2 * counts[-1], self.batch_size))
        return counts

    def warm_up(self, rows=None):
        """Compiles the search for every source length bucket, at each of
        `rows` (row counts; by default every one of `row_counts()`), so
        that translating later compiles nothing. Under torch, whose loops
        are recorded per shape, each shape is decoded to its longest output
        (EOS never ends it), recording its loops at once, so that every
        phase of the growing caches is recorded.

        Returns:
            `(programs, seconds)`: the shapes run, and the time it took.
        """
        rows = self.row_counts() if rows is None else list(rows)
        for count in rows:
            if count not in self.row_counts():
                raise ValueError(
                    f"warm_up rows must be among this translator's batch row counts "
                    f"{self.row_counts()}. Received: {count!r}"
                )
        start = time.perf_counter()
        loops = self._search.loops if keras.backend.backend() == "torch" else None
        for count in rows:
            for length in self.source_lengths:
                source_ids = np.full((count, length), self.tokenizer.eos_id, "int32")
                if loops is not None:
                    # The loop of each phase of the caches, recorded: decoded
                    # to the longest output, EOS never.
                    limits = np.full((count,), length - 1 + self.max_extra_length, "int32")
                    with loops.recording_at_once():
                        self._run_search(source_ids, limits, -1)
                elif keras.backend.backend() != "torch":  # compiled whole for the shape: one step is enough
                    self._run_search(source_ids, np.ones((count,), "int32"), self.tokenizer.eos_id)
        return len(rows) * len(self.source_lengths), time.perf_counter() - start

    def _run_search(self, source_ids, limits, eos_id):
        if not self.target_prefix:
            return self._search(source_ids, limits, eos_id)
        prefix = np.tile(np.array(self.target_prefix, "int32"), (len(source_ids), 1))
        return self._search(source_ids, limits, eos_id, prefix)

    def with_search(self, **changes):
        """This translator with other search settings (`SearchSettings`
        fields by name, as `beam_size=1`; `target_prefix=[]` for none): the
        same model (quantized or not), tokenizer and other settings."""
        other = Translator(
            self.model, self.tokenizer, self.search_settings.replace(**changes),
            max_source_length=self.max_source_length, batch_size=self.batch_size, jit_compile=self.jit_compile,
            languages=self.languages,
        )
        other.quantize = self.quantize  # its model is this one's, already quantized
        return other

    def with_target_prefix(self, text):
        """This translator with `text`'s target pieces as its prefix, made
        once per text, so that a prefix used again compiles nothing again."""
        if text not in self.derived:
            self.derived[text] = self.with_search(target_prefix=self.tokenizer.tokenize_target([text])[0])
        return self.derived[text]

    def with_languages(self, source_language=None, target_language=None):
        """This translator for another pair of a multilingual model's
        languages (None keeps a side's): the source language's token begins
        each source, and the target language's each output. Made once per pair."""
        if not hasattr(self.tokenizer, "with_languages"):
            raise ValueError(f"This translator translates {self.languages or 'one pair'} only; languages are chosen "
                             "for multilingual models (M2M-100, NLLB-200).")
        tokenizer = self.tokenizer.with_languages(source_language, target_language)
        pair = (tokenizer.source_language, tokenizer.target_language)
        if pair not in self.derived:
            self.derived[pair] = other = self.with_search(target_prefix=tokenizer.tokenize_target(""))
            other.tokenizer, other.languages = tokenizer, check_pair(pair)
        return self.derived[pair]

    def translate(self, texts, first_line=0, split_sentences=False, target_prefix=None):
        """Translates each string; returns a list of strings, aligned.

        `first_line` counts the lines before `texts` in their file, for
        the line numbers of warnings. With `split_sentences`, each string
        is split into sentences in the rules of its source language
        (`keras_transformer.data.sentences`), each sentence is translated
        (one longer than `max_source_length` in pieces, with a warning,
        not cut), and the string is put back together, its line breaks and
        spacing kept. `target_prefix`, a string, begins each translation
        (`with_target_prefix`)."""
        if target_prefix is not None:
            return self.with_target_prefix(target_prefix).translate(texts, first_line, split_sentences)
        if split_sentences:
            return translate_by_sentence(self, check_texts(texts), first_line)
        return [hypotheses[0][0] for hypotheses in self.n_best(texts, first_line)]

    def translate_stream(self, lines, window=streaming.WINDOW_LINES):
        """Translations of an iterable of lines, yielded in their order.

        The lines are read `window` at a time; each window is sorted by
        length into batches, translated, and yielded before the next is
        read, so memory holds one window whatever the number of lines
        (`keras_transformer.decoding.translate_file` writes a file's so).

        Example:
            >>> with open("in.en") as lines:
            ...     for translation in translator.translate_stream(lines):
            ...         print(translation)
        """
        for _, translations in streaming.translated_windows(self, lines, window):
            yield from translations

    def n_best(self, texts, first_line=0, count=None):
        """The `count` best translations of each string, best first: all
        `beam_size` by default (at most that many); with `sampling`,
        `count` samples (1 by default), each drawn alone.

        Returns:
            For each string, a list of `(translation, score)` pairs, where
            score is log P(translation) / lp(length) (greedy search and
            sampling: log P). An empty line gets `[("", 0.0)]`.
        """
        texts = check_texts(texts)
        self.check_n_best(count)
        sources = self._source_ids(texts, first_line)
        # Samples of a sentence are rows of their own, whose draws differ.
        draws = count if self.sampling and count else 1
        found = self._search_sources({(i, draw): ids for i, ids in sources.items() for draw in range(draws)})
        # One detokenizer call for every hypothesis of every sentence.
        translations = iter(self.detokenize([row for _, ids, _ in found.values() for row in ids.tolist()]))
        results = [[] if i in sources else [("", 0.0)] for i in range(len(texts))]
        for (i, _), (_, ids, scores) in found.items():
            results[i] += [(next(translations), float(score)) for score in scores]
        if draws > 1:
            results = [sorted(hypotheses, key=lambda pair: -pair[1]) for hypotheses in results]
        return [hypotheses[:count] for hypotheses in results]

    def check_n_best(self, count):
        """`count` hypotheses per sentence are `n_best`'s to give: at most the
        beam size, or any number of samples."""
        if count is None:
            return
        if isinstance(count, bool) or not isinstance(count, int) or count < 1 or (
                not self.sampling and count > self.beam_size):
            raise ValueError(
                f"n_best must be an integer from 1 to the beam size, {self.beam_size} (any number of samples with "
                f"sampling). Received: n_best={count!r}"
            )

    def score(self, sources, targets, token_scores=False, first_line=0):
        """A `scoring.Score` of each target (a list of strings) as the
        translation of its source: its log-probability, the tokens scored
        and, with `token_scores`, each token's (`decoding.scoring`)."""
        return scoring.score_texts(self, sources, targets, token_scores, first_line)

    def search(self, texts, first_line=0):
        """Token ids of the search, for the non-blank strings.

        Returns:
            A dict from the index of each non-blank string to
            `(source_ids, ids, scores)`: the source ids as decoded (EOS
            last), int `[beam_size, length]` output ids (EOS, then 0s) and
            float `[beam_size]` scores, best first.
        """
        return self._search_sources(self._source_ids(check_texts(texts), first_line))

    def search_ids(self, sources):
        """The search of token id lists, each ending with EOS (what
        `search` decodes for its strings), in batches of similar length.

        Returns:
            For each list, `(ids, scores)` as `search` gives them.
        """
        sources = [list(map(int, ids)) for ids in sources]
        for i, ids in enumerate(sources):
            if not 1 < len(ids) <= self.max_source_length or ids[-1] != self.tokenizer.eos_id:
                raise ValueError(
                    f"sources[{i}] must hold 2 to max_source_length={self.max_source_length} ids, "
                    f"EOS ({self.tokenizer.eos_id}) last. Received {len(ids)} ids ending with "
                    f"{ids[-1:] or 'nothing'}"
                )
        found = self._search_sources(dict(enumerate(sources)))
        return [found[i][1:] for i in range(len(sources))]

    def _search_sources(self, sources):
        order = sorted(sources, key=lambda i: len(sources[i]))
        results = {}
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            source_ids, limits = self._batch(
                [sources[i] for i in rows], rows_wanted=self.rows_for(len(rows))
            )
            ids, scores = self._run_search(source_ids, limits, self.tokenizer.eos_id)
            for row, i in enumerate(rows):
                results[i] = (sources[i], ids[row], scores[row])
        return results

    def _source_ids(self, texts, first_line=0):
        """Token ids of each non-blank line, followed by EOS, by line index."""
        lines = [i for i, text in enumerate(texts) if text.strip()]
        if not lines:
            return {}
        tokenized = self.tokenizer.tokenize([texts[i] for i in lines])
        sources = {}
        for i, ids in zip(lines, tokenized):
            if len(ids) + 1 > self.max_source_length:
                warnings.warn(
                    f"Line {first_line + i + 1} (texts[{i}]) has {len(ids)} subword tokens, more than max_source_length="
                    f"{self.max_source_length} allows (EOS included); translating its first {self.max_source_length - 1} "
                    "tokens only.", stacklevel=4,
                )
                ids = ids[: self.max_source_length - 1]
            sources[i] = ids + [self.tokenizer.eos_id]
        return sources

    def rows_for(self, count):
        """The rows (of `row_counts()`) a batch of `count` sentences is padded to."""
        return next(rows for rows in self.row_counts() if rows >= count)

    def _batch(self, sources, rows_wanted):
        """Pads to a bucket length, and to `rows_wanted` rows by repeating
        the last sentence (whose search then ends with it)."""
        sources = sources + [sources[-1]] * (rows_wanted - len(sources))
        source_ids = padded_ids(sources, self.source_lengths)
        # "input length + 50": the source tokens before EOS.
        limits = np.array([len(ids) - 1 + self.max_extra_length for ids in sources], "int32")
        return source_ids, limits

    def detokenize(self, id_lists):
        """Strings from lists of ids, each cut at its first EOS."""
        rows = []
        for ids in id_lists:
            if self.tokenizer.eos_id in ids:
                ids = ids[: ids.index(self.tokenizer.eos_id)]
            rows.append([t for t in ids if t != 0])
        return [self.tokenizer.detokenize(row) for row in rows]

    def get_config(self):
        return self.search_settings.get_config() | {
            name: getattr(self, name) for name in ("max_source_length", "batch_size", "quantize")
        } | {"languages": None if self.languages is None else list(self.languages)}

    def save(self, directory):
        """Writes the model, the vocabulary and the search settings.

        The directory then holds `model.keras`, `subword.model`,
        `subword.json` and `translator.json`; `Translator.load` reads it
        under any backend.
        """
        save_keras_model(self.model, os.path.join(directory, MODEL_FILE))
        self.tokenizer.save(directory)
        self.save_settings(directory)

    def save_settings(self, directory):
        """Writes only the search settings (`translator.json`), as `tune
        --save` does for a directory `save` wrote."""
        write_atomically(os.path.join(directory, CONFIG_FILE), json.dumps(self.get_config(), indent=2))

    @classmethod
    def load(cls, directory, compile=False, **overrides):
        """A `Translator` from a directory written by `save`.

        Args:
            directory: the directory.
            compile: also compile its model for `fit`, so that
                `translator.model.fit(...)` goes on training it: as it was
                saved, with its optimizer's state, where `model.keras`
                holds them (a model saved compiled); otherwise as the
                `train` run that wrote the directory compiled it, with the
                optimizer state of its newest checkpoint where it has one
                (`training.compile_as_run`). The model's kernels then lie
                in Keras's order under torch, as in training.
            **overrides: settings that replace the saved ones, such as
                `beam_size=1`.
        """
        model = translator_directory.read_model(directory, for_training=compile)
        if compile and getattr(model, "optimizer", None) is None:
            from keras_transformer.training.continued import compile_as_run  # training imports decoding

            compile_as_run(model, directory)
        config = translator_directory.read_settings(directory)
        config.update(overrides)
        tokenizer = load_tokenizer(directory)
        try:
            return cls(model, tokenizer, **config)
        except (TypeError, ValueError) as error:
            if any(f"{name}=" in str(error) for name in overrides):
                raise
            # A setting saved in the file, not one given now.
            raise type(error)(f"{os.path.join(directory, CONFIG_FILE)}: {error}") from None

    @classmethod
    def from_preset(cls, preset, source_language=None, target_language=None, compile=False, **overrides):
        """A `Translator` from a preset, as keras-hub's tasks load one.

        Args:
            preset: a translator directory (`train`, `convert` and `save`
                write one), a published checkpoint's directory in
                transformers' or fairseq's layout, or a hub id such as
                `"hf://Helsinki-NLP/opus-mt-en-de"` (or without `hf://`).
                A checkpoint is converted once (`keras_transformer.convert`)
                into `$XDG_CACHE_HOME/keras-transformer/presets`, and
                loaded from there afterwards.
            source_language, target_language: a multilingual model's pair
                (M2M-100, NLLB-200), in its codes.
            compile, **overrides: as for `load`.
        """
        directory = translator_directory.preset_directory(preset, source_language, target_language)
        translator = cls.load(directory, compile=compile, **overrides)
        if (source_language or target_language) and hasattr(translator.tokenizer, "with_languages"):
            return translator.with_languages(source_language, target_language)
        return translator
