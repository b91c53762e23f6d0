"""A model's step function for the searches, and the search of a batch.

`cached_step_function` runs the encoder once and decodes one position per
step from the model's caches; `search_translations` runs beam or greedy
search over it, with self-attention buffers that grow with the output.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.backend import shapes
from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.greedy_search import greedy_search
from keras_transformer.decoding.settings import SearchSettings
from keras_transformer.models.config import POSITION_TABLES


# The first length of the self-attention buffers when they grow with the
# output (`cache_lengths`).
FIRST_CACHE_LENGTH = 16


def cached_step_function(model, source_ids, max_length, cache_length=None, decoding=None):
    """The model's step function for `beam_search` and `greedy_search`.

    The encoder runs once, here, and so do the target position encodings.
    Cross-attention keys and values are computed once per sentence and
    shared by its beams; the self-attention keys and values grow by one
    position per step in buffers of `cache_length` positions, which
    `grow_cache` lengthens. Only those buffers are the search state, which
    the search reorders as it chooses beams.

    Args:
        model: a `Transformer`.
        source_ids: int `[B, S]`, each sentence followed by EOS, then 0s.
        max_length: the most target positions decoded.
        cache_length: the buffers' first length; `max_length` by default.
        decoding: the `backend.options.DecodingOptions` of the compiled
            function this runs in, or None.

    Returns:
        `(step_fn, initial_state)`. `step_fn(ids, index, state)` feeds
        `ids[:, index]` to `Transformer.decode_step` and returns the logits
        of position `index + 1` and the updated buffers. The state given
        is the search's alone: a step may write it in place.
        `step_fn.narrow(start)` is the step function of sentences `start:`
        alone (`beam_search`'s `narrow_step`).
    """
    encoder_output, encoder_padding_mask = model.encode(source_ids, decoding=decoding)
    cache = model.initial_cache(
        encoder_output, max_length if cache_length is None else cache_length, decoding=decoding
    )
    # One copy per sentence: the decoder blocks attend to it with the
    # queries of the sentence's beams side by side.
    cross_attention_cache = [block["cross_attention"] for block in cache]
    position_table = model.target_position_table(max_length)

    def over(cross_attention_cache, encoder_padding_mask):
        def step_fn(ids, index, self_attention_cache):
            step = None if decoding is None else decoding.for_step()
            target_ids = shapes.slice(ids, [0, index], [shapes.shape(ids)[0], 1], decoding=step)
            logits, updated = model.decode_step(
                target_ids,
                [
                    {"self_attention": s, "cross_attention": c}
                    for s, c in zip(self_attention_cache, cross_attention_cache)
                ],
                index,
                encoder_padding_mask,
                position_table,
                decoding=step,
            )
            return logits[:, 0], [block["self_attention"] for block in updated]

        return step_fn

    step_fn = over(cross_attention_cache, encoder_padding_mask)
    # The sentences from `start` on, alone: `beam_search`'s `narrow_step`.
    step_fn.narrow = lambda start: over(
        keras.tree.map_structure(lambda x: x[start:], cross_attention_cache), encoder_padding_mask[start:]
    )
    return step_fn, [block["self_attention"] for block in cache]


def growing_step_function(model, source_ids, max_length, decoding=None):
    """`cached_step_function` with self-attention buffers that grow with the
    output, for `beam_search` and `greedy_search`.

    Returns:
        `(step_fn, initial_state, growth)`: `growth` holds the searches'
        `state_lengths` (`cache_lengths`; None if the buffers do not grow)
        and `grow_state` (`grow_cache`) arguments.
    """
    lengths = cache_lengths(max_length)
    step_fn, initial_state = cached_step_function(
        model, source_ids, max_length, None if lengths is None else lengths[0], decoding
    )
    return step_fn, initial_state, {"state_lengths": lengths, "grow_state": grow_cache}


def cache_lengths(max_length, first=FIRST_CACHE_LENGTH):
    """The lengths of self-attention buffers that grow with the output:
    `first`, doubled until `max_length` is reached, as `(16, 32, 64, 70)`
    for a `max_length` of 70.

    None, for buffers of `max_length` from the start, if `max_length` is at
    most `first`, or is a tensor. It is one under TensorFlow without XLA,
    where one trace of the search serves every shape (`CompiledFunction`),
    and phases of lengths only known at run time made the search slower.
    """
    if not isinstance(max_length, int) or max_length <= first:
        return None
    lengths = [first]
    while lengths[-1] * 2 < max_length:
        lengths.append(lengths[-1] * 2)
    return tuple(lengths) + (max_length,)


def grow_cache(self_attention_cache, length):
    """The self-attention buffers of `cached_step_function`, each `[B, heads,
    positions, head_dim]`, padded with zeros to `length` positions."""
    return keras.tree.map_structure(
        lambda buffer: ops.pad(
            buffer, [[0, 0], [0, 0], [0, length - ops.shape(buffer)[2]], [0, 0]]
        ),
        self_attention_cache,
    )


def search_translations(
    model,
    source_ids,
    sentence_max_length,
    settings=None,
    *,
    bos_id,
    eos_id,
    start_id=None,
    forced_ids=None,
    decoding=None,
    **options,
):
    """Beam search (greedy search for a beam of 1; a sampling search with
    `settings.sampling`) with the cached decoder.

    Args:
        model: a `Transformer`.
        source_ids: int `[B, S]`, each sentence followed by EOS, then 0s.
        sentence_max_length: int `[B]`, the most tokens each output may have.
        settings: the `SearchSettings` (the paper's by default); the
            searches' options, its logits processors, and
            `max_extra_length`: how many positions past `S` an output may
            reach.
        bos_id: the first target token.
        eos_id: the token that ends a translation.
        start_id: the token BOS counts as in an output, for the
            repetition options (`processors.output_ids`); BOS by default.
        forced_ids: optional int `[B, P]`, the target prefix of each output.
        decoding: the `backend.options.DecodingOptions` of the compiled
            function this runs in, or None.
        **options: settings that replace those of `settings`, by name
            (`beam_size=1`).

    Returns:
        `(ids [B, beam_size, S + max_extra_length], scores [B, beam_size])`,
        best first.
    """
    settings = (settings or SearchSettings()).replace(**options)
    max_length = ops.shape(source_ids)[1] + settings.max_extra_length
    if model.position_encoding in POSITION_TABLES:
        # No output outgrows the learned positions.
        if isinstance(max_length, int):
            max_length = min(max_length, model.max_length)
        else:
            max_length = ops.minimum(max_length, model.max_length)
    # The self-attention buffers grow with the output, so that attending to
    # them and reordering them costs what the output so far needs.
    step_fn, initial_state, growing = growing_step_function(model, source_ids, max_length, decoding)
    initial_ids = ops.full((ops.shape(source_ids)[0],), bos_id, dtype="int32")
    common = dict(
        max_length=max_length, eos_id=eos_id, sentence_max_length=sentence_max_length, forced_ids=forced_ids,
        force_eos=settings.force_eos, processors=settings.processors(eos_id, bos_id if start_id is None else start_id), decoding=decoding, **growing,
    )
    if settings.beam_size == 1 or settings.sampling:
        ids, scores = greedy_search(step_fn, initial_ids, initial_state, sampler=settings.sampler(), **common)
        return ids[:, None], scores[:, None]
    return beam_search(
        step_fn,
        initial_ids,
        initial_state,
        beam_size=settings.beam_size,
        alpha=settings.alpha,
        penalty=settings.length_penalty,
        early_stopping=settings.early_stopping,
        narrow_step=step_fn.narrow,
        steps_per_iteration=search_steps_per_iteration(
            initial_state, settings.beam_size, max_length, xla=decoding is not None and decoding.xla
        ),
        **common,
    )


# The cache size, in bytes, from which a compiled beam search runs two steps
# an iteration (`search_steps_per_iteration`).
PAIRED_STEPS_CACHE_BYTES = 16 * 2**20


def search_steps_per_iteration(self_attention_cache, beam_size, max_length, xla=False):
    """`beam_search`'s `steps_per_iteration` for a search over
    `self_attention_cache` (`cached_step_function`'s buffers, `[B, ...]`).

    Under XLA each step's reordering of the cache writes a new buffer, which
    XLA copies back into the loop's: a second pass over every cached key
    and value. Two steps an iteration spare that copy, and double the loop
    bodies that XLA compiles, which pays for large caches only. So a search pairs its
    steps when compiled by XLA (`xla`) and when its cache, at `max_length`
    positions for every beam, holds at least `PAIRED_STEPS_CACHE_BYTES`.
    """
    if not xla or not isinstance(max_length, int):
        return 1
    total = 0
    for buffer in keras.tree.flatten(self_attention_cache):
        batch, heads, _, head_dim = buffer.shape
        if not all(isinstance(n, int) for n in (batch, heads, head_dim)):
            return 1
        itemsize = np.dtype(keras.backend.standardize_dtype(buffer.dtype)).itemsize
        total += batch * beam_size * heads * max_length * head_dim * itemsize
    return 2 if total >= PAIRED_STEPS_CACHE_BYTES else 1
