"""Parsing with a trained `Transformer`: beam search that only writes trees.

Section 6.3: the output length is the input length + 300, with beam 21 and
alpha 0.3. Beam search here is the translation's (`decoding.beam_search`),
over a step function that gives every token that would break the tree a
log-probability of -1e9, so each hypothesis that ends is one tree over
exactly the sentence's words, whatever the model's weights.
"""

import numpy as np
from keras import ops

from keras_transformer.decoding.selection import NEG_INF
from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.compiled import CompiledFunction
from keras_transformer.decoding.steps import growing_step_function
from keras_transformer.parsing.linearization import delinearize


def well_formed_steps(step_fn, token_classes, word_counts, limits, source_ids=None):
    """`step_fn` with the tokens that cannot continue a tree masked out.

    At each step, from the tokens chosen so far (depth d of open
    constituents, n words placed of the sentence's W, and the positions
    left before the hypothesis's limit), a token is allowed if:

    - `(label)` opens a constituent: the root first, then only inside it,
      while words remain to fill it;
    - a word places the next word, inside the root, while words remain:
      `XX`, or, given `source_ids` (copied words), only the id of the
      sentence's next word, which takes the probability of all words;
    - `)` closes a constituent that holds something, the root only once
      every word is placed;
    - EOS ends, once the root is closed;

    and, after it, the W - n words, d closings and EOS still left fit before
    the limit. One of them always is, so every hypothesis is well formed by
    its limit. (A limit must leave room for the smallest tree: W + 3.)

    Args:
        step_fn: a step function for `beam_search`.
        token_classes: `(opens, closes, words, eos)`, one bool per id
            (`ParsingVocabulary.token_classes`).
        word_counts: int `[batch * beam_size]`, W of each row's sentence.
        limits: int `[batch * beam_size]`, the most tokens each row may
            generate, EOS included.
        source_ids: int `[batch * beam_size, source_length]`, each row's
            sentence, for copied words; None for `XX`.

    Returns:
        A step function for `beam_search`.
    """
    opens, closes, words, eos = (ops.convert_to_tensor(np.asarray(c, bool)) for c in token_classes)
    counts = [ops.cast(c, "int32") for c in (opens, closes, words)]
    word_counts = ops.cast(word_counts, "int32")
    limits = ops.cast(limits, "int32")
    if source_ids is not None:
        source_ids = ops.cast(source_ids, "int32")
        vocabulary_ids = ops.arange(len(token_classes[0]), dtype="int32")

    def step(ids, index, state):
        logits, state = step_fn(ids, index, state)
        chosen = ids[:, 1:]  # [N, L]: the tokens so far, then 0s (no class)
        opened, closed, placed = (ops.sum(ops.take(c, chosen, axis=0), axis=1) for c in counts)
        depth = opened - closed  # [N]
        words_left = word_counts - placed  # [N]
        last = ops.slice(ids, [0, index], [ops.shape(ids)[0], 1])[:, 0]
        last_opened = ops.take(opens, last, axis=0)  # [N]
        # Positions after this step's token, up to the limit.
        left = limits - (index + 1)
        started = ops.greater(index, 0)
        inside = ops.greater(depth, 0)
        have_words = ops.greater(words_left, 0)
        can_open = have_words & (inside | ops.logical_not(started)) & (words_left + depth + 2 <= left)
        can_place = inside & have_words & (words_left + depth <= left)
        can_close = (
            inside
            & ops.logical_not(last_opened)
            & (ops.greater(depth, 1) | ops.logical_not(have_words))
            & (words_left + depth <= left)
        )
        can_end = ops.logical_not(inside) & started & ops.logical_not(have_words)
        allowed = (
            (opens[None, :] & can_open[:, None])
            | (words[None, :] & can_place[:, None])
            | (closes[None, :] & can_close[:, None])
            | (eos[None, :] & can_end[:, None])
        )  # [N, V]
        if source_ids is not None:
            # Copied words: the sentence's next word, and no other, with the
            # model's whole belief that a word comes next. (Left to its own
            # logit, a word the model reads as another gets little mass, and
            # the search opens constituent after constituent instead.)
            position = ops.minimum(placed, ops.shape(source_ids)[1] - 1)[:, None]
            next_word = ops.take_along_axis(source_ids, position, axis=1)  # [N, 1]
            is_next_word = ops.equal(vocabulary_ids[None, :], next_word)  # [N, V]
            logits = ops.cast(logits, "float32")
            any_word = ops.logsumexp(ops.where(words[None, :], logits, NEG_INF), axis=-1, keepdims=True)  # [N, 1]
            logits = ops.where(is_next_word, any_word, logits)
            allowed = allowed & (ops.logical_not(words)[None, :] | is_next_word)
        return ops.where(allowed, logits, NEG_INF), state

    return step


class Parser:
    """Parses sentences with a trained `Transformer` and its `ParsingVocabulary`.

    Sentences are sorted by length and decoded in batches; each output is
    read back into a tree over the sentence's words.

    Args:
        model: a `Transformer` trained on linearized trees.
        vocabulary: its `ParsingVocabulary`.
        beam_size: 21 in the paper.
        alpha: the length penalty, 0.3 in the paper.
        max_extra_length: an output may be this many tokens longer than its
            sentence (300 in the paper), and is at least long enough for
            the smallest tree.
        batch_size: sentences decoded together.
    """

    def __init__(self, model, vocabulary, beam_size=21, alpha=0.3, max_extra_length=300, batch_size=16):
        for name, value, least in (("beam_size", beam_size, 1), ("max_extra_length", max_extra_length, 0), ("batch_size", batch_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}. Received: {name}={value!r}")
        if len(vocabulary) != model.vocabulary_size:
            raise ValueError(
                f"The vocabulary has {len(vocabulary)} tokens, the model {model.vocabulary_size}."
            )
        self.model = model
        self.vocabulary = vocabulary
        self.beam_size = beam_size
        self.alpha = alpha
        self.max_extra_length = max_extra_length
        self.batch_size = batch_size
        self._search = CompiledFunction(self._search_batch, model, input_ranks=(2, 1, 1))

    def _search_batch(self, source_ids, word_counts, limits, decoding=None):
        max_length = ops.shape(source_ids)[1] + self.max_extra_length + 3
        step_fn, initial_state, growing = growing_step_function(self.model, source_ids, max_length, decoding)
        per_row = ops.repeat(word_counts, self.beam_size, axis=0)
        copied = self.vocabulary.target_words == "copied"
        step_fn = well_formed_steps(
            step_fn, self.vocabulary.token_classes(), per_row, ops.repeat(limits, self.beam_size, axis=0),
            source_ids=ops.repeat(source_ids, self.beam_size, axis=0) if copied else None,
        )
        initial_ids = ops.full((ops.shape(source_ids)[0],), self.vocabulary.bos_id, dtype="int32")
        ids, _ = beam_search(
            step_fn, initial_ids, initial_state, beam_size=self.beam_size, alpha=self.alpha,
            max_length=max_length, eos_id=self.vocabulary.eos_id, sentence_max_length=limits,
            decoding=decoding, **growing,
        )  # fmt: skip
        return ids[:, 0]

    def parse(self, sentences, tags=None):
        """Trees of `sentences` (lists of words), with `tags` (lists of
        part-of-speech tags, such as the gold ones for scoring) at their
        leaves, or `XX`."""
        sentences = [list(words) for words in sentences]
        for i, words in enumerate(sentences):
            if not words or not all(isinstance(w, str) and w and not any(c.isspace() for c in w) for w in words):
                raise ValueError(
                    f"sentences[{i}] must be a non-empty list of words without spaces. Received: {words!r}"
                )
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        tokens = [None] * len(sentences)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            sources = [self.vocabulary.encode_sentence(sentences[i]) for i in rows]
            length = max(len(s) for s in sources)
            length = -(-length // 8) * 8  # a few shapes for compiled backends
            source_ids = np.zeros((len(rows), length), "int32")
            for row, ids in enumerate(sources):
                source_ids[row, : len(ids)] = ids
            counts = np.array([len(sentences[i]) for i in rows], "int32")
            # Room for the smallest tree (root, words, close, EOS) at least.
            limits = counts + np.maximum(self.max_extra_length, 3)
            found = self._search(source_ids, counts, limits)
            for row, i in enumerate(rows):
                tokens[i] = self.vocabulary.decode(found[row])
        tags = tags if tags is not None else [None] * len(sentences)
        return [delinearize(t, words, tag) for t, words, tag in zip(tokens, sentences, tags)]
