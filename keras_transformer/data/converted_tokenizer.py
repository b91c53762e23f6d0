"""What a converted model's tokenizer shares: our ids around a published
tokenizer's (`IdMap`), and the `SubwordTokenizer` surface that the
translator, the data pipeline and the export call."""

import json

import numpy as np


def read_vocabulary(content, name):
    """A published vocabulary file's pieces and ids, checked (`vocab.json`)."""
    try:
        vocabulary = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{name} cannot be read as JSON ({error}).") from None
    if not isinstance(vocabulary, dict):
        raise ValueError(f"{name} must be a JSON object of pieces to ids. Received: {type(vocabulary).__name__}")
    wrong = [(piece, i) for piece, i in vocabulary.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0]
    if wrong:
        raise ValueError(f"{name} must map pieces to ids >= 0. Received: {wrong[0][0]!r}: {wrong[0][1]!r}")
    return vocabulary


class ConvertedTokenizer:
    """Our ids over a published tokenizer's.

    A subclass gives `published_ids(text, target)`, the published
    tokenizer's ids of a text (without EOS), and `published_text(ids)`, the
    target text of published ids with the special ones dropped. Ids 0 to 3
    are ours: `padding_id`, `unknown_id`, `bos_id`, `eos_id`.

    Args:
        id_map: the `IdMap` from the published ids to ours.
    """

    padding_id = 0
    unknown_id = 1
    bos_id = 2
    eos_id = 3

    def __init__(self, id_map):
        self.id_map = id_map
        self.vocabulary_size = id_map.vocabulary_size
        # The published special ids, which detokenizing drops.
        self.published_special = set(id_map.special.values())

    def tokenize(self, strings, num_threads=None, target=False):
        """Our ids of a source string (a target string with `target=True`),
        or of each of a sequence of them, without BOS or EOS."""
        if isinstance(strings, str):
            return self.id_map.to_ours(self.published_ids(strings, target))
        strings = list(strings)
        for index, text in enumerate(strings):
            if not isinstance(text, str):
                raise TypeError(f"`strings[{index}]` must be a str. Received: {type(text).__name__} {text!r:.60}")
        return [self.id_map.to_ours(self.published_ids(text, target)) for text in strings]

    def tokenize_target(self, strings, num_threads=None):
        return self.tokenize(strings, num_threads, target=True)

    def detokenize(self, ids):
        """Target text from our ids (1-D: a string; 2-D: a list of them);
        special ids are dropped."""
        if isinstance(ids, np.ndarray) or hasattr(ids, "shape"):
            ids = np.asarray(ids).tolist()
        ids = list(ids)
        if ids and not isinstance(ids[0], (int, np.integer)):
            return [self.detokenize(row) for row in ids]
        published = self.id_map.to_published([int(i) for i in ids])
        return self.published_text([i for i in published if i not in self.published_special])
