"""A synthetic sequence-transduction task, for tests and a first run."""

import numpy as np

from keras_transformer.models import PADDING_ID

BOS_ID = 1
EOS_ID = 2
FIRST_TOKEN_ID = 3


def reversal_task(
    num_examples,
    vocabulary_size=16,
    min_length=3,
    max_length=10,
    reverse=True,
    seed=0,
):
    """Random token sequences to copy or reverse, as model-ready arrays.

    Each source is `min_length` to `max_length` tokens drawn uniformly from
    ids `FIRST_TOKEN_ID .. vocabulary_size - 1`; its target is the same
    sequence reversed (or copied, with `reverse=False`), then EOS. Reversal
    needs attention to find the source token at position (length - 1 - t),
    so it shows quickly whether attention, masks and positions work.

    Args:
        num_examples: how many pairs.
        vocabulary_size: the model's vocabulary, including padding (0), BOS
            (1) and EOS (2).
        min_length: the shortest source.
        max_length: the longest source.
        reverse: reverse the source rather than copy it.
        seed: the random seed; equal seeds give equal data.

    Returns:
        `(inputs, labels)`: `inputs` is a dict of int32 `"source_ids"`
        `[num_examples, max_length]` and `"target_ids"`
        `[num_examples, max_length + 1]` (BOS, then the target shifted
        right), and `labels` is int32 `[num_examples, max_length + 1]` (the
        target, then EOS). All are padded with 0.
    """
    if vocabulary_size <= FIRST_TOKEN_ID:
        raise ValueError(
            f"`vocabulary_size` must exceed {FIRST_TOKEN_ID}, the ids kept "
            f"for padding, BOS and EOS. Received: vocabulary_size="
            f"{vocabulary_size}"
        )
    if not 1 <= min_length <= max_length:
        raise ValueError(
            "Expected 1 <= min_length <= max_length. Received: "
            f"min_length={min_length}, max_length={max_length}"
        )
    rng = np.random.default_rng(seed)
    source_ids = np.full((num_examples, max_length), PADDING_ID, "int32")
    target_ids = np.full((num_examples, max_length + 1), PADDING_ID, "int32")
    labels = np.full((num_examples, max_length + 1), PADDING_ID, "int32")
    lengths = rng.integers(min_length, max_length + 1, size=num_examples)
    for row, length in enumerate(lengths):
        tokens = rng.integers(FIRST_TOKEN_ID, vocabulary_size, size=length)
        target = tokens[::-1] if reverse else tokens
        source_ids[row, :length] = tokens
        target_ids[row, : length + 1] = np.concatenate([[BOS_ID], target])
        labels[row, : length + 1] = np.concatenate([target, [EOS_ID]])
    return {"source_ids": source_ids, "target_ids": target_ids}, labels
