"""A text's sentences, and the text put back together from their
translations, line breaks, paragraphs and spacing kept.

A model translates sentences: a paragraph sent whole is decoded as one long
input, past what the model saw in training, and past its
`max_source_length` it would be cut. So a text is split into lines, each
line into sentences by `sentencex` (Wikimedia's rule-based splitter:
native, maintained, with rules for many languages and fallbacks for the
rest; chosen over pysbd and syntok by `benchmarks/serve_load.py --splitters`:
as accurate on WMT news, and hundreds of times faster), and every character
that is not a sentence (line breaks, blank lines, the spaces between
sentences) stays where it was.

A sentence longer than the model takes is decoded in pieces of its tokens
(`pieces`), never cut short.
"""

import dataclasses
import warnings

MISSING_SPLITTER = 'splitting sentences needs sentencex: pip install "keras-vaswani[serve]" (or pip install sentencex)'


@dataclasses.dataclass
class Layout:
    """A text as its sentences and what lies between them.

    Attributes:
        parts: strings kept as they are, and None where a sentence's
            translation goes, in order.
        sentences: the sentences, in order, without surrounding spaces.
    """

    parts: list
    sentences: list

    def join(self, translations):
        """The text with each sentence replaced by its translation."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(self.sentences)} sentences need as many translations; received {len(translations)}")
        translations = iter(translations)
        return "".join(next(translations) if part is None else part for part in self.parts)


def split_text(text, language=None, sentences=True):
    """The `Layout` of `text`: its sentences (`sentences=False`: its
    non-blank lines) in the rules of `language` (a code such as "de";
    None for the splitter's default, English)."""
    segment = _segmenter() if sentences else None
    parts, found = [], []
    for number, line in enumerate(text.split("\n")):
        if number:
            parts.append("\n")
        segments = [line] if segment is None or not line.strip() else list(segment(language or "en", line))
        if "".join(segments) != line:  # nothing is lost, whatever the splitter does
            segments = [line]
        for piece in segments:
            core = piece.strip()
            if not core:
                parts.append(piece)
                continue
            start = piece.index(core)
            parts.extend([piece[:start], None, piece[start + len(core) :]])
            found.append(core)
    return Layout(parts, found)


def pieces(ids, longest):
    """`ids` in consecutive pieces of at most `longest` tokens (one piece
    when it fits)."""
    if longest < 1:
        raise ValueError(f"longest must be >= 1. Received: {longest!r}")
    return [ids[start : start + longest] for start in range(0, len(ids), longest)] or [ids]


def check_splitter():
    """Raises a ValueError that says what to install if sentencex is
    missing: for the commands, which say it in one line before they start."""
    try:
        _segmenter()
    except ImportError as error:
        raise ValueError(str(error)) from None


def _segmenter():
    try:
        import sentencex
    except ImportError:
        raise ImportError(MISSING_SPLITTER) from None
    return sentencex.segment


def sources_in_pieces(tokenized, longest, eos_id):
    """Each tokenized sentence as sources of at most `longest` tokens, EOS
    added.

    Returns:
        `(sources, owners, split)`: the sources; for each, the index of its
        sentence; and `(index, tokens, pieces)` of each sentence that was
        longer than `longest`.
    """
    sources, owners, split = [], [], []
    for index, ids in enumerate(tokenized):
        found = pieces(list(ids), longest)
        if len(found) > 1:
            split.append((index, len(ids), len(found)))
        sources.extend(piece + [eos_id] for piece in found)
        owners.extend([index] * len(found))
    return sources, owners, split


def joined(translations, owners, count):
    """The translation of each of `count` sentences: its pieces', joined by
    a space."""
    found = [[] for _ in range(count)]
    for owner, translation in zip(owners, translations):
        found[owner].append(translation)
    return [" ".join(parts) for parts in found]


def check_texts(texts):
    """`texts` as a list of strings (bytes decoded as UTF-8), or a clear error."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(
            "translate() takes a list of strings. Received a single "
            f"{type(texts).__name__}: {texts[:50]!r}; wrap it in a list."
        )
    texts = list(texts)
    for i, text in enumerate(texts):
        if isinstance(text, bytes):
            try:
                texts[i] = text.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"texts[{i}] is not valid UTF-8 ({error}). "
                    f"Received: {text[:50]!r}"
                ) from None
        elif not isinstance(text, str):
            raise TypeError(
                f"texts[{i}] must be a string. Received: "
                f"{type(text).__name__} {text!r}"
            )
    return texts


def translate_by_sentence(translator, texts, first_line=0):
    """`Translator.translate(texts, split_sentences=True)`: each text split
    into sentences in its source language's rules, each sentence translated
    (one over `max_source_length` in pieces, with a warning), and the text
    put back together with its line breaks and spacing."""
    layouts = [split_text(text, translator.languages and translator.languages[0]) for text in texts]
    sentences = [sentence for layout in layouts for sentence in layout.sentences]
    texts_of = [i for i, layout in enumerate(layouts) for _ in layout.sentences]
    tokenizer = translator.tokenizer
    sources, owners, split = sources_in_pieces(
        tokenizer.tokenize(sentences) if sentences else [], translator.max_source_length - 1, tokenizer.eos_id
    )
    for index, tokens, count in split:
        i = texts_of[index]
        warnings.warn(
            f"Line {first_line + i + 1} (texts[{i}]) has a sentence of {tokens} subword tokens, more than "
            f"max_source_length={translator.max_source_length} allows (EOS included); it was translated in "
            f"{count} pieces.",
            stacklevel=3,
        )
    found = translator.search_ids(sources) if sources else []
    translations = iter(joined(translator.detokenize([ids[0].tolist() for ids, _ in found]), owners, len(sentences)))
    return [layout.join([next(translations) for _ in layout.sentences]) for layout in layouts]
