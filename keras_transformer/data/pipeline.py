"""From sentence pairs in memory to token-bucketed batches."""

import itertools

import numpy as np

from keras_transformer.data.batches import TOKEN_ALIGNMENT
from keras_transformer.data.batches import TokenBatches
from keras_transformer.data.batches import bucket_lengths  # noqa: F401 (re-exported)
from keras_transformer.data.prepared import tokenize_pairs


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
    buckets=None,
    token_alignment=TOKEN_ALIGNMENT,
    shard=(0, 1),
):
    """Batches of sentence pairs sized by token count, for `model.fit`.

    Tokenizes `corpus` in memory with the shared subword tokenizer and
    batches it as `TokenBatches` does (section 5.1), on every backend. For
    a corpus too large for memory, prepare it once (`prepare_dataset`) and
    batch the prepared set with `TokenBatches`.

    Args:
        corpus: a `ParallelCorpus`, or any sequence of (source, target)
            string pairs.
        tokenizer: a `SubwordTokenizer`.
        tokens_per_batch: the budget of padded tokens per side per batch.
        shuffle: shuffle the pairs (each epoch anew) before bucketing.
        max_length: pairs with a side longer than this many subword tokens
            (EOS included) are left out, with a warning.
        repeat: repeat the data without end, so that every batch is full;
            `model.fit` then needs `steps_per_epoch`.
        seed: the shuffle seed: batch k is then the same for every run.
        batch_multiple: make the number of pairs in a full batch a multiple
            of this, such as the number of data-parallel replicas.
        bucket_step: each bucket length is about this factor longer than
            the one before (8, 9, ..., 20, 22, 24, ... at 1.1). Coarser
            steps, such as 1.3, give fewer shapes and more padding.
        buckets: at most this many bucket lengths, fitted to the corpus's
            lengths for the least padding; replaces `bucket_step`.
        token_alignment: a full batch holds up to 1/32 fewer pairs to make
            its tokens a multiple of a power of two up to this (64: what
            XLA pads products to on a GPU); 1 turns that off.
        shard: `(index, count)`: this process's share of each batch's
            rows, when several processes train one model
            (`training.Distribution().data_shard`).

    Returns:
        A `TokenBatches` (a `keras.utils.PyDataset`) of
        `({"source_ids", "target_ids"}, labels)`, int32 `[batch, length]`.
    """
    if len(corpus) == 0:
        raise ValueError("Cannot batch an empty corpus. Received: 0 pairs")
    sources, targets = zip(*corpus)
    return TokenBatches(
        tokenize_pairs(sources, targets, tokenizer),
        tokens_per_batch,
        max_length=max_length,
        shuffle=shuffle,
        repeat=repeat,
        seed=seed,
        batch_multiple=batch_multiple,
        bucket_step=bucket_step,
        buckets=buckets,
        token_alignment=token_alignment,
        shard=shard,
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
    for inputs, labels in itertools.islice(dataset, max_batches):
        source = np.asarray(inputs["source_ids"])
        target = np.asarray(labels)
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
