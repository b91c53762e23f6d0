"""Sampling the next token: from the whole vocabulary, the top k, or the
nucleus of probability p (Holtzman et al., 2020), at a temperature; the
token selection of a sampling search (`greedy_search`'s `sampler`), as
CTranslate2's `sampling_topk`, `sampling_topp` and `sampling_temperature`
and fairseq's `--sampling-topk`/`--sampling-topp` choose.

The draws are our own: a counter-based hash of (seed, step, row), in int32
arithmetic that wraps alike on every backend, turned into one uniform
number per row and step, and the token found where it falls in the
cumulative probabilities (inverse transform sampling). The same seed and
rows give the same samples on every backend, inside a compiled loop,
without a random state to carry.
"""

from keras import ops

from keras_transformer.decoding.selection import best_tokens
from keras_transformer.decoding.selection import top_k

# Multipliers of Wellons's "lowbias32" integer hash, as int32.
_FIRST = 0x7FEB352D
_SECOND = 0x846CA68B - 2**32


def _shift_right(x, bits):
    """A logical right shift of int32 `x` (its sign bit shifted in as 0)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def mix(x):
    """An int32 hash of int32 `x`, wrapping on overflow."""
    x = ops.bitwise_xor(x, _shift_right(x, 16)) * _FIRST
    x = ops.bitwise_xor(x, _shift_right(x, 15)) * _SECOND
    return ops.bitwise_xor(x, _shift_right(x, 16))


def uniform(seed, index, rows):
    """float32 `[rows]` in [0, 1): one number per row, a function of the
    seed (an int), the step `index` (an int32 scalar) and the row alone."""
    # The seed offset by the golden ratio's bits (no seed hashes to 0), as int32.
    offset = ((seed + 0x9E3779B9) & 0xFFFFFFFF ^ 0x80000000) - 0x80000000
    key = mix(mix(ops.cast(index, "int32") + mix(ops.convert_to_tensor(offset, dtype="int32"))))
    bits = mix(ops.arange(rows, dtype="int32") * _FIRST + key)
    return ops.cast(_shift_right(bits, 8), "float32") * (1.0 / (1 << 24))


class Sampler:
    """Draws each row's next token from its scores `[N, V]` (logits, after
    the logits processors): divided by `temperature`, limited to the `k`
    best or to the nucleus of probability `p` (the fewest best tokens whose
    probabilities reach p), and renormalized.

    Args:
        k: None, or the number of best tokens drawn from.
        p: None, or the nucleus's probability, in (0, 1].
        temperature: > 0.
        seed: an int.
    """

    def __init__(self, k=None, p=None, temperature=1.0, seed=0):
        self.k, self.p, self.temperature, self.seed = k, p, temperature, seed

    def __call__(self, scores, index):
        rows, vocabulary_size = ops.shape(scores)
        scores = scores / self.temperature
        if self.k == 1:  # the best token: nothing to draw
            return best_tokens(scores)[0]
        if self.k is not None and self.k < vocabulary_size:
            candidates, tokens = top_k(scores, self.k)  # [N, k], best first
        elif self.p is not None:
            candidates, tokens = ops.top_k(scores, vocabulary_size)  # the whole vocabulary, best first
        else:
            candidates, tokens = scores, None
        probabilities = ops.softmax(candidates, axis=-1)
        cumulative = ops.cumsum(probabilities, axis=-1)
        if self.p is not None:
            # A token is in the nucleus if the better ones fall short of p.
            probabilities = ops.where(ops.less(cumulative - probabilities, self.p), probabilities, 0.0)
            cumulative = ops.cumsum(probabilities, axis=-1)
        drawn = uniform(self.seed, index, rows) * cumulative[:, -1]  # [N], below the candidates' total
        position = ops.sum(ops.cast(ops.less_equal(cumulative, drawn[:, None]), "int32"), axis=-1)
        position = ops.minimum(position, ops.shape(candidates)[-1] - 1)  # [N]
        if tokens is None:
            return position
        return ops.take_along_axis(tokens, position[:, None], axis=-1)[:, 0]
