"""From sentence pairs to token-bucketed batches, in `tf.data`."""

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
    (or target) ids never exceeds `tokens_per_batch`, and the full batches of
    a bucket share one shape. The last batch of each bucket in an epoch is
    smaller unless `repeat` is set.

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
            must divide the batch. Use it with `repeat=True`, whose batches
            are all full.

    Returns:
        A `tf.data.Dataset` of `({"source_ids", "target_ids"}, labels)`,
        int32 `[batch, length]`.
    """
    if len(corpus) == 0:
        raise ValueError("Cannot batch an empty corpus. Received: 0 pairs")
    if tokens_per_batch < max_length:
        raise ValueError(
            "`tokens_per_batch` must hold at least one pair of `max_length` "
            f"tokens. Received: tokens_per_batch={tokens_per_batch}, "
            f"max_length={max_length}"
        )
    sources, targets = zip(*corpus)
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
    lengths = bucket_lengths(max_length)
    dataset = dataset.bucket_by_sequence_length(
        pair_length,
        bucket_boundaries=[length + 1 for length in lengths[:-1]],
        bucket_batch_sizes=[
            max(batch_multiple, tokens_per_batch // length // batch_multiple * batch_multiple)
            for length in lengths
        ],
    )
    padded_lengths = tf.constant(lengths, tf.int32)

    def to_model_inputs(source_ids, target_ids, labels):
        # Both sides are padded to the bucket's length, so every full batch
        # of a bucket has one shape, and XLA and jax.jit compile one program
        # per bucket (plus one for its last, smaller batch of an epoch).
        longest = tf.maximum(tf.shape(source_ids)[1], tf.shape(target_ids)[1])
        padded = tf.gather(padded_lengths, tf.searchsorted(padded_lengths, [longest]))[0]

        def pad(ids):
            return tf.pad(ids, [[0, 0], [0, padded - tf.shape(ids)[1]]])

        return {"source_ids": pad(source_ids), "target_ids": pad(target_ids)}, pad(labels)

    return dataset.map(to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE
    )


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
        rows = source.shape[0]
        real += int((source != 0).sum() + (target != 0).sum())
        padded += source.size + target.size
        pairs += rows
        batches += 1
        if rows == tokens_per_batch // source.shape[1]:
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
