"""Token selection, shared by the searches: the best token of each row
(greedy search), the best extensions of a beam (a top-k made for large
vocabularies), and the tokens a search must take (a target prefix, EOS at
the limit)."""

import math

from keras import ops

# A log-probability no hypothesis reaches: it marks empty slots. Finite, so
# that sums and differences of it stay finite.
NEG_INF = -1.0e9


def best_tokens(scores):
    """The best token of each row of `scores` `[N, V]`: the first that
    reaches the row's largest score, and that score, `([N] int32, [N])`.
    Two plain reductions, which XLA vectorizes better than its argmax."""
    vocabulary_size = ops.shape(scores)[-1]
    best = ops.max(scores, axis=-1)  # [N]
    tokens = ops.min(
        ops.where(
            ops.equal(scores, best[:, None]),
            ops.arange(vocabulary_size, dtype="int32"),
            vocabulary_size - 1,  # also the answer if no score equals the max (NaN)
        ),
        axis=-1,
    )  # [N]
    return tokens, best


def top_k(scores, k, chunk_size=128):
    """`ops.top_k(scores, k)` of float `[B, n]` scores, for k far below n.

    The k best scores of a row lie in the k chunks of `chunk_size`
    consecutive scores whose maxima are best: a chunk left out has a
    maximum no better than each of k chunks taken, and each of those holds
    a score at least that good (with ties, a lower index). So one maximum
    per chunk, a top-k over the maxima, and a top-k over the chosen chunks'
    scores find them. XLA's top-k looks at every one of the `B * n` scores
    (a beam search's `beam_size * vocabulary_size` candidates per sentence)
    several times more slowly than it takes their maxima. Among equal scores the lower index
    comes first where `ops.top_k` puts it first (TensorFlow and JAX; torch's
    top-k orders ties as it likes).

    Returns:
        `(values [B, k], indices [B, k])`, best first.
    """
    n = scores.shape[-1]
    if not isinstance(n, int) or n <= 2 * k * chunk_size:
        return ops.top_k(scores, k)
    batch_size = ops.shape(scores)[0]
    whole = n - n % chunk_size  # the scores of whole chunks; the rest is a short last chunk
    maxima = ops.max(ops.reshape(scores[:, :whole], (batch_size, -1, chunk_size)), axis=-1)
    if whole < n:  # its maximum apart, rather than a padded copy of every score
        maxima = ops.concatenate([maxima, ops.max(scores[:, whole:], axis=-1, keepdims=True)], axis=1)
    _, best_chunks = ops.top_k(maxima, k)
    best_chunks = ops.sort(best_chunks, axis=-1)  # in index order, for ties
    if whole == n:  # the chosen chunks, gathered whole
        chunks = ops.take_along_axis(
            ops.reshape(scores, (batch_size, -1, chunk_size)), best_chunks[:, :, None], axis=1
        )
        values, positions = ops.top_k(ops.reshape(chunks, (batch_size, k * chunk_size)), k)
        chunk = ops.take_along_axis(best_chunks, positions // chunk_size, axis=1)
        return values, chunk * chunk_size + positions % chunk_size
    indices = ops.reshape(
        best_chunks[:, :, None] * chunk_size + ops.arange(chunk_size, dtype=best_chunks.dtype),
        (batch_size, k * chunk_size),
    )  # [B, k * C], in index order
    candidates = ops.where(  # the short chunk's positions past n score nothing
        ops.less(indices, n), ops.take_along_axis(scores, ops.minimum(indices, n - 1), axis=1), -math.inf
    )
    values, positions = ops.top_k(candidates, k)
    return values, ops.take_along_axis(indices, positions, axis=1)


def forced_tokens(forced_ids, force_eos, eos_id, sentence_max_length):
    """The tokens the search must take, as a function of the step:
    `forced_ids[:, index]` while the forced prefix lasts (int `[B, P]`, or
    None), then EOS at the sentence's limit with `force_eos` (the last
    token a sentence may have, as transformers' `forced_eos_token_id`
    forces it). Made once, before the loop; None if nothing is ever forced.

    Returns:
        None, or `at(index) -> (tokens [B], forcing [B] bool)`.
    """
    if forced_ids is None and not force_eos:
        return None
    batch_size = ops.shape(sentence_max_length)[0]
    # At least 0: a warm-up that never ends (EOS -1) still names a token.
    # (A sum, not `full`: under torch, `full` reads a tensor EOS to the host.)
    eos = ops.zeros((batch_size,), dtype="int32") + ops.cast(ops.maximum(eos_id, 0), "int32")
    prefix_length = 0 if forced_ids is None else ops.shape(forced_ids)[1]
    # The prefix, then a column past it, so that any step names one.
    columns = eos[:, None] if forced_ids is None else ops.concatenate([ops.cast(forced_ids, "int32"), eos[:, None]], axis=1)
    never = ops.zeros((batch_size,), dtype="bool")

    def at(index):
        tokens = ops.take(columns, ops.minimum(index, prefix_length), axis=1)  # [B]
        at_limit = ops.greater_equal(index + 1, sentence_max_length) if force_eos else never
        return tokens, ops.logical_or(ops.less(index, prefix_length), at_limit)

    return at



def forced_extensions(top_log_probs, top_indices, alive_log_probs, vocabulary_size, tokens, forcing):
    """The 2K best extensions `(log-probabilities, indices into K * V)`,
    where a sentence is forced: each alive beam extended by its token at no
    cost (log-probability 0), in the beams' order (best first), then K empty
    slots. What the search would take from extensions all but the token's
    made impossible, without a pass over them."""
    beam_size = ops.shape(alive_log_probs)[1]
    forced_log_probs = ops.concatenate([alive_log_probs, ops.full_like(alive_log_probs, NEG_INF)], axis=1)
    beams = ops.concatenate([ops.arange(beam_size, dtype="int32"), ops.zeros((beam_size,), dtype="int32")])
    forced_indices = ops.cast(beams[None, :] * vocabulary_size + tokens[:, None], top_indices.dtype)  # [B, 2K]
    return (
        ops.where(forcing[:, None], forced_log_probs, top_log_probs),
        ops.where(forcing[:, None], forced_indices, top_indices),
    )
