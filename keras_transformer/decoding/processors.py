"""Logits processors: changes to a search step's next-token scores that the
searches share, as CTranslate2's logits processors and transformers'
`LogitsProcessor`s are.

Greedy search applies them to the step's logits before it takes the best
token; beam search to the log-probabilities before it extends its beams
(both as transformers' `generate` does). `SearchSettings.processors` makes
the list a translator's settings ask for.
"""

import abc
from typing import Any
from typing import NamedTuple

from keras import ops

from keras_transformer.decoding.selection import NEG_INF


class Step(NamedTuple):
    """What a processor may read of the step."""

    index: Any  # int32 []: tokens chosen so far (a forced prefix's too); this step chooses token index + 1
    ids: Any  # int32 [N, L + 1]: BOS, the tokens chosen so far, then 0s


def output_ids(step, start_id):
    """`step.ids` with BOS read as `start_id`: a converted model's BOS
    copies the token its decoding starts from (EOS for fairseq's models,
    padding for Marian's), which the published model's repetition rules
    count as that token (`ConvertedTokenizer.start_as_id`)."""
    first = ops.equal(ops.arange(ops.shape(step.ids)[1], dtype="int32"), 0)[None, :]
    return ops.where(first, ops.cast(start_id, "int32"), step.ids)


class LogitsProcessor(abc.ABC):
    """One change to a step's scores, `[N, V]` float32 -> `[N, V]`."""

    @abc.abstractmethod
    def __call__(self, scores, step):
        """The changed scores, given the `Step`."""


class MinLength(LogitsProcessor):
    """No EOS before an output holds `min_length` tokens, its EOS included
    (transformers' `MinLengthLogitsProcessor`, counting as its `min_length`
    counts for encoder-decoder models)."""

    def __init__(self, min_length, eos_id):
        self.min_length = min_length
        self.eos_id = eos_id

    def __call__(self, scores, step):
        too_short = ops.less(step.index + 1, self.min_length)
        is_eos = ops.equal(ops.arange(ops.shape(scores)[-1], dtype="int32"), ops.cast(self.eos_id, "int32"))
        return ops.where(ops.logical_and(too_short, is_eos)[None, :], NEG_INF, scores)


class RepetitionPenalty(LogitsProcessor):
    """Each token an output already holds (its BOS and forced tokens too)
    scores `score / penalty` where its score is positive, `score *
    penalty` where not: less likely again for a penalty above 1 (Keskar
    et al., 2019; transformers' and CTranslate2's `repetition_penalty`)."""

    def __init__(self, penalty, start_id):
        self.penalty = penalty
        self.start_id = start_id

    def __call__(self, scores, step):
        ids = output_ids(step, self.start_id)
        chosen = ops.less_equal(ops.arange(ops.shape(ids)[1], dtype="int32"), step.index)[None, :]  # [1, L + 1]
        held = _flags(ids, ops.logical_and(chosen, ops.ones_like(ids, dtype="bool")), ops.shape(scores))
        return ops.where(held, ops.where(scores > 0, scores / self.penalty, scores * self.penalty), scores)


class NoRepeatNgram(LogitsProcessor):
    """No n-gram of `size` tokens twice in an output: a token that would
    end one the output already holds is banned (transformers'
    `no_repeat_ngram_size` and fairseq's `--no-repeat-ngram-size`; the
    output's BOS counts as transformers counts its start token)."""

    def __init__(self, size, start_id):
        self.size = size
        self.start_id = start_id

    def __call__(self, scores, step):
        n = self.size
        ids = output_ids(step, self.start_id)
        rows, length = ops.shape(ids)
        starts = length - n + 1  # the n-grams' first positions
        if starts < 1:
            return scores
        # The last n - 1 tokens chosen: an n-gram that begins with them ends
        # in a banned token. (None fit before index + 2 >= n.)
        last = ops.take(ids, ops.maximum(step.index - (n - 2) + ops.arange(n - 1, dtype="int32"), 0), axis=1)
        begins_alike = ops.ones((rows, starts), dtype="bool")
        for k in range(n - 1):
            begins_alike = ops.logical_and(begins_alike, ops.equal(ids[:, k : k + starts], last[:, k : k + 1]))
        whole = ops.logical_and(  # the n-gram's last token is chosen, and the output has n - 1 tokens to follow on
            ops.less_equal(ops.arange(starts, dtype="int32") + n - 1, step.index), ops.greater_equal(step.index + 2, n)
        )[None, :]
        banned = _flags(ids[:, n - 1 :], ops.logical_and(begins_alike, whole), ops.shape(scores))
        return ops.where(banned, NEG_INF, scores)


def _flags(tokens, where, shape):
    """bool `shape` `[N, V]`: True at `(n, tokens[n, p])` where `where[n, p]`."""
    rows, width = ops.shape(tokens)
    indices = ops.stack(
        [ops.repeat(ops.arange(rows, dtype="int32"), width), ops.reshape(ops.cast(tokens, "int32"), (-1,))], axis=1
    )
    return ops.greater(ops.scatter(indices, ops.reshape(ops.cast(where, "float32"), (-1,)), shape), 0)


def apply(processors, scores, step):
    """`scores` after each processor in turn."""
    for processor in processors:
        scores = processor(scores, step)
    return scores
