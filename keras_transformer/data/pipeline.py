"""From sentence pairs to token-bucketed batches, in `tf.data`."""

import numbers
import warnings

import numpy as np
import tensorflow as tf

TOKENIZE_CHUNK = 1024


def bucket_lengths(max_length, min_length=8, step=1.1):
    """Padded lengths that batches round up to: 8, 9, ..., growing ~10%.

    Rounding every batch to one of these lengths keeps padding to about 5%
    while giving compiled backends (XLA, `jax.jit`) a few dozen shapes to
    compile instead of one per batch.
    """
    lengths = []
    length = min(min_length, max_length)
    while length < max_length:
        lengths.append(length)
        length = max(length + 1, int(length * step))
    return lengths + [max_length]


def make_dataset(
    corpus,
    tokenizer,
    tokens_per_batch,
    shuffle=True,
    max_length=256,
    repeat=False,
    seed=None,
    batch_multiple=1,
    bucket_step=1.1,
):
    """Batches of sentence pairs sized by token count, for `model.fit`.

    Section 5.1: "Sentence pairs were batched together by approximate
    sequence length. Each training batch contained a set of sentence pairs
    containing approximately 25000 source tokens and 25000 target tokens."

    Each pair is tokenized in the graph with the shared subword tokenizer:
    the source gets EOS, the decoder input is BOS + target (the target
    shifted right), and the labels are target + EOS. Pairs are grouped by
    length into buckets; a batch of bucket b holds `tokens_per_batch // b`
    pairs, each side padded with 0 to b tokens, so a batch of padded source
    (or target) ids never exceeds `tokens_per_batch`. The last, smaller batch
    of each bucket in an epoch is filled up with rows of padding, which the
    loss and the metrics ignore, so that every batch of a bucket has one
    shape: XLA and `jax.jit` compile one program per bucket length.

    Before batching, one pass over the corpus counts the subword tokens of
    every pair. Pairs too long for `max_length` are left out with a warning
    that counts them; if none is left, that is an error. Without `repeat`,
    the dataset knows its number of batches, which `model.fit` then shows.

    Args:
        corpus: a `ParallelCorpus`, or any sequence of (source, target)
            string pairs.
        tokenizer: a `SubwordTokenizer`.
        tokens_per_batch: the budget of padded tokens per side per batch.
        shuffle: shuffle the pairs (each epoch anew) before bucketing.
        max_length: pairs with a side longer than this many subword tokens
            (EOS included) are left out.
        repeat: repeat the data without end, so that every batch is full;
            `model.fit` then needs `steps_per_epoch`.
        seed: the shuffle seed. With `repeat=True`, a seed makes the stream
            of batches the same for every iterator over it, which is what
            resuming a run needs.
        batch_multiple: make the number of pairs in a full batch a multiple
            of this, such as the number of data-parallel replicas, which
            must divide the batch.
        bucket_step: each bucket length is about this factor longer than
            the one before (8, 9, ..., 20, 22, 24, ... at 1.1). Coarser
            steps, such as 1.3, give fewer shapes and more padding: fewer
            programs for `jax.jit` to compile in a short run.

    Returns:
        A `tf.data.Dataset` of `({"source_ids", "target_ids"}, labels)`,
        int32 `[batch, length]`.
    """
    if len(corpus) == 0:
        raise ValueError("Cannot batch an empty corpus. Received: 0 pairs")
    for name, value, least in (
        ("max_length", max_length, 2),  # at least one token and EOS
        ("tokens_per_batch", tokens_per_batch, 1),
        ("batch_multiple", batch_multiple, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"`{name}` must be an integer >= {least}. Received: {name}={value!r}")
    if tokens_per_batch < max_length:
        raise ValueError(
            "`tokens_per_batch` must hold at least one pair of `max_length` "
            f"tokens. Received: tokens_per_batch={tokens_per_batch}, "
            f"max_length={max_length}"
        )
    if not (isinstance(bucket_step, (int, float)) and 1.0 <= bucket_step <= 4.0):
        raise ValueError(
            f"`bucket_step` must be a number from 1 to 4. Received: bucket_step={bucket_step!r}"
        )
    sources, targets = zip(*corpus)
    lengths = bucket_lengths(max_length, step=bucket_step)
    batch_sizes = [
        max(batch_multiple, tokens_per_batch // length // batch_multiple * batch_multiple)
        for length in lengths
    ]
    pair_lengths = _pair_lengths(sources, targets, tokenizer)
    too_long = int((pair_lengths > max_length).sum())
    if too_long == len(pair_lengths):
        raise ValueError(
            f"Every pair is longer than max_length={max_length} subword tokens "
            f"(EOS or BOS included), so no batch can be made. The shortest "
            f"pair has {int(pair_lengths.min())} tokens."
        )
    if too_long:
        warnings.warn(
            f"make_dataset leaves out {too_long} of {len(pair_lengths)} pairs "
            f"({too_long / len(pair_lengths):.1%}) with a side longer than "
            f"max_length={max_length} subword tokens.",
            stacklevel=2,
        )
    # Full batches of each bucket, plus its last, padded one.
    pairs_per_bucket = np.bincount(
        np.searchsorted(lengths, pair_lengths[pair_lengths <= max_length]),
        minlength=len(lengths),
    )
    batches_per_epoch = int(sum(-(-n // size) for n, size in zip(pairs_per_bucket, batch_sizes)))
    if repeat and shuffle and seed is not None:
        # Pass p over the data is shuffled by a stateless permutation of
        # seed (seed, p) alone. Every iterator then yields the same batches,
        # however many were made before it, so a run resumed after a crash
        # and `dataset.skip(steps)` see what an uninterrupted run saw.
        source_texts = tf.constant(list(sources))
        target_texts = tf.constant(list(targets))

        def shuffled_pass(index):
            order = tf.random.experimental.stateless_shuffle(
                tf.range(len(sources), dtype=tf.int64),
                seed=tf.stack([tf.constant(seed, tf.int64), index]),
            )
            return tf.data.Dataset.from_tensor_slices(order).map(
                lambda i: (tf.gather(source_texts, i), tf.gather(target_texts, i))
            )

        dataset = tf.data.Dataset.range(2**62).flat_map(shuffled_pass)
    else:
        dataset = tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))
        if shuffle:
            dataset = dataset.shuffle(len(sources), seed=seed)
        if repeat:
            dataset = dataset.repeat()

    def to_ids(sources, targets):
        """Tokenizes a chunk of pairs; returns ragged [chunk, None] ids."""
        source_tokens = tokenizer.tokenize(sources)
        target_tokens = tokenizer.tokenize(targets)
        chunk = tf.shape(sources)[:1]
        bos = tf.fill(tf.concat([chunk, [1]], 0), tokenizer.bos_id)
        eos = tf.fill(tf.concat([chunk, [1]], 0), tokenizer.eos_id)
        return (
            tf.concat([source_tokens, eos], 1),  # x_1 .. x_n EOS
            tf.concat([bos, target_tokens], 1),  # BOS y_1 .. y_m
            tf.concat([target_tokens, eos], 1),  # y_1 .. y_m EOS
        )

    def as_tensors(*ids):
        # Rows of a ragged batch come out of `unbatch` typed as ragged
        # tensors of rank 1, which `padded_batch` refuses; they are plain.
        return tuple(tf.identity(row) for row in ids)

    # Tokenizing a chunk at a time is much faster than one pair at a time.
    dataset = (
        dataset.batch(TOKENIZE_CHUNK)
        .map(to_ids, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
        .map(as_tensors)
    )

    def pair_length(source_ids, target_ids, labels):
        return tf.maximum(tf.shape(source_ids)[0], tf.shape(target_ids)[0])

    def short_enough(*ids):
        return pair_length(*ids) <= max_length

    dataset = dataset.filter(short_enough)
    dataset = dataset.bucket_by_sequence_length(
        pair_length,
        bucket_boundaries=[length + 1 for length in lengths[:-1]],
        bucket_batch_sizes=batch_sizes,
    )
    padded_lengths = tf.constant(lengths, tf.int32)
    full_batch_sizes = tf.constant(batch_sizes, tf.int32)

    def to_model_inputs(source_ids, target_ids, labels):
        # Both sides are padded to the bucket's length, and a bucket's last
        # batch to its full number of rows, so that every batch of a bucket
        # has one shape.
        longest = tf.maximum(tf.shape(source_ids)[1], tf.shape(target_ids)[1])
        bucket = tf.searchsorted(padded_lengths, [longest])[0]
        rows = full_batch_sizes[bucket] - tf.shape(source_ids)[0]
        columns = padded_lengths[bucket]

        def pad(ids):
            return tf.pad(ids, [[0, rows], [0, columns - tf.shape(ids)[1]]])

        return {"source_ids": pad(source_ids), "target_ids": pad(target_ids)}, pad(labels)

    dataset = dataset.map(to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE)
    if not repeat:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches_per_epoch))
    # No tf.data autotuning: `model.fit` drops its iterator at each epoch's
    # end, and with autotuning on, dropping it could wait, idle, on a tf.data
    # thread: 25 s at the second epoch of every JAX quick start on 2 cores,
    # 5 s under TensorFlow. `AUTOTUNE` parallelism then means one call per
    # core, which keeps up with training here.
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


def _pair_lengths(sources, targets, tokenizer):
    """The longer side of each pair in subword tokens, with EOS (or BOS)."""
    lengths = []
    for start in range(0, len(sources), 8 * TOKENIZE_CHUNK):
        end = start + 8 * TOKENIZE_CHUNK
        source = tokenizer.tokenize(list(sources[start:end])).row_lengths().numpy()
        target = tokenizer.tokenize(list(targets[start:end])).row_lengths().numpy()
        lengths.append(np.maximum(source, target) + 1)
    return np.concatenate(lengths)


def batch_statistics(dataset, tokens_per_batch, max_batches=None):
    """How full and how padded the batches of `make_dataset` are.

    Returns:
        A dict: `batches`; `pairs`; `real_tokens` and `padded_tokens` (both
        sides); `padding_fraction` (padding / padded tokens);
        `full_batch_fill` (the mean padded size of a side over the budget,
        among batches holding their bucket's full number of pairs);
        and `full_batches_within_10_percent` (their share whose larger side
        holds 90% to 100% of the budget).
    """
    real = padded = pairs = batches = 0
    fills = []
    for inputs, labels in dataset.take(max_batches or -1):
        source = inputs["source_ids"].numpy()
        target = labels.numpy()
        rows = int((target != 0).any(1).sum())  # rows of padding hold no pair
        real += int((source != 0).sum() + (target != 0).sum())
        padded += source.size + target.size
        pairs += rows
        batches += 1
        if rows == source.shape[0]:
            fills.append(source.size / tokens_per_batch)
    fills = np.array(fills)
    return {
        "batches": batches,
        "pairs": pairs,
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_fraction": 1.0 - real / max(padded, 1),
        "full_batch_fill": float(fills.mean()) if fills.size else float("nan"),
        "full_batches_within_10_percent": float(((fills >= 0.9) & (fills <= 1.0)).mean())
        if fills.size
        else float("nan"),
    }
