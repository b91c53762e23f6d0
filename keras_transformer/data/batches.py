"""Token-bucketed batches from a length index, the same on every backend.

Section 5.1: "Sentence pairs were batched together by approximate sequence
length. Each training batch contained a set of sentence pairs containing
approximately 25000 source tokens and 25000 target tokens."

Batch k of a run is a function of (seed, k) alone: epoch e = k // B (B
batches an epoch) shuffles each bucket's pairs and then the order of the
batches with generators seeded by (seed, e). A run resumed at step k starts
at batch k without replaying the data, and sees what an uninterrupted run
would have seen.
"""

import copy
import itertools
import numbers
import threading
import warnings

import keras
import numpy as np

from keras_transformer.data.tokenizer import SubwordTokenizer

BOS_ID = SubwordTokenizer.bos_id
EOS_ID = SubwordTokenizer.eos_id


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


def padded_ids(id_lists, lengths):
    """int32 `[rows, length]`: the lists, each followed by 0s, at the first
    of `lengths` (`bucket_lengths`) that holds the longest."""
    length = next(n for n in lengths if n >= max(map(len, id_lists)))
    array = np.zeros((len(id_lists), length), "int32")
    for row, ids in enumerate(id_lists):
        array[row, : len(ids)] = ids
    return array


# XLA on a GPU pads the operands of a product over the tokens to a multiple
# of 64 rows when they are not, a copy of each (in a base-size step on an
# H200 at [462, 54], ten gigabytes of pads).
TOKEN_ALIGNMENT = 64


def aligned_rows(rows, length, alignment=TOKEN_ALIGNMENT):
    """The most rows up to `rows` whose `rows * length` tokens are a multiple
    of the largest power of two up to `alignment` that costs at most 1/32 of
    the rows; `rows` itself where none does."""
    multiple = 1 << (int(alignment).bit_length() - 1)  # the largest power of two up to it
    while multiple > 1:
        step = multiple // np.gcd(multiple, length)  # rows * length % multiple == 0 iff rows % step == 0
        fewer = rows // step * step
        if fewer and rows - fewer <= rows / 32:
            return int(fewer)
        multiple //= 2
    return int(rows)


def fitted_bucket_lengths(histogram, count):
    """At most `count` padded lengths that pad the pairs of `histogram` least.

    A pair of length l goes to the shortest bucket length >= l, so its
    batch costs that length in padded tokens per row; the sum over all pairs
    is minimised by dynamic programming over the lengths that occur.

    Args:
        histogram: `histogram[l]` pairs have length l.
        count: how many lengths at most (compiled shapes, under XLA).

    Returns:
        Increasing lengths, the last the longest that occurs.
    """
    values = np.flatnonzero(histogram)
    if not len(values):
        raise ValueError("Cannot fit bucket lengths to an empty histogram.")
    pairs_up_to = np.concatenate([[0], np.cumsum(np.asarray(histogram)[values], dtype=np.float64)])
    n, count = len(values), min(count, len(values))
    # cost[b, j]: the least padded tokens of the pairs of the first j lengths
    # in b buckets, the last ending at values[j - 1].
    cost = np.full((count + 1, n + 1), np.inf)
    cost[0, 0] = 0.0
    split = np.zeros((count + 1, n + 1), np.int64)
    for b in range(1, count + 1):
        for j in range(b, n + 1):
            totals = cost[b - 1, :j] + values[j - 1] * (pairs_up_to[j] - pairs_up_to[:j])
            split[b, j] = np.argmin(totals)
            cost[b, j] = totals[split[b, j]]
    b, j, lengths = int(np.argmin(cost[:, n])), n, []
    while j:
        lengths.append(int(values[j - 1]))
        j, b = int(split[b, j]), b - 1
    return lengths[::-1]


class TokenBatches(keras.utils.PyDataset):
    """Batches of `TokenizedPairs` sized by token count, for `model.fit`.

    The source gets EOS, the decoder input is BOS + target (the target
    shifted right), and the labels are target + EOS. A batch of bucket
    length L holds `tokens_per_batch // L` pairs, each side padded with 0 to
    L tokens, so padded source (or target) ids never exceed
    `tokens_per_batch`; a few pairs fewer where that makes the batch's
    tokens a multiple of 64 (`aligned_rows`), which products on GPUs take
    without padding them. The last batch of a bucket in an epoch is filled up
    with rows of padding, which the loss and the metrics ignore, so every
    batch of a bucket has one shape: XLA and `jax.jit` compile one program
    per bucket length. Pairs longer than `max_length` are left out, with a
    warning that counts them.

    Args:
        pairs: `TokenizedPairs` (in memory, or mapped by `load_prepared`).
        tokens_per_batch: the budget of padded tokens per side per batch.
        max_length: the longest pair kept, in tokens with EOS (or BOS).
        shuffle: shuffle each epoch anew; otherwise batches go bucket by
            bucket in corpus order, the same every epoch.
        repeat: batches without end (batch k is epoch k // B's batch k % B),
            for `model.fit(steps_per_epoch=...)`; otherwise one epoch.
        seed: the shuffle's seed; None draws one from NumPy's global
            generator (which `keras.utils.set_random_seed` seeds).
        batch_multiple: full batches hold a multiple of this many pairs,
            such as the number of data-parallel replicas.
        token_alignment: each replica's share of a full batch is lowered
            by at most 1/32 to make its tokens a multiple of a power of two
            up to this (`aligned_rows`); 1 keeps `tokens_per_batch // L`.
        bucket_step: each bucket length is about this factor longer than
            the one before; coarser steps give fewer shapes, more padding.
        buckets: at most this many bucket lengths, placed where the pairs'
            lengths are so that padding is least (`fitted_bucket_lengths`);
            replaces `bucket_step`'s lengths. Few shapes for XLA at little
            padding.
        shard: `(index, count)`: this process's share of each batch's rows,
            for `count` processes training on the same batches.
        sampling: a `SubwordSampling` that draws each pair's segmentation
            anew as its batch is made (subword regularization), or None.
        accumulate: batches per optimizer update (`compile_model(...,
            accumulate=N)`): batches k N to k N + N - 1 make update k, and
            each comes with a weight for its loss, N times its share of
            the update's target tokens. Keras averages the batches'
            gradients, so the update is normalized by the target tokens of
            all N, as one batch holding their sentences would be.
        **kwargs: `keras.utils.PyDataset`'s `workers`,
            `use_multiprocessing` and `max_queue_size`.

    Each item is `({"source_ids", "target_ids"}, labels)`, int32
    `[batch, length]` NumPy arrays; with `accumulate` above 1, then the
    loss's weights, float32 `[batch, length]` (a batch's all the same).
    """

    def __init__(
        self,
        pairs,
        tokens_per_batch,
        max_length=256,
        shuffle=True,
        repeat=False,
        seed=None,
        batch_multiple=1,
        token_alignment=TOKEN_ALIGNMENT,
        bucket_step=1.1,
        buckets=None,
        shard=(0, 1),
        accumulate=1,
        sampling=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if len(pairs) == 0:
            raise ValueError("Cannot batch an empty corpus. Received: 0 pairs")
        for name, value, least in (
            ("max_length", max_length, 2),  # at least one token and EOS
            ("tokens_per_batch", tokens_per_batch, 1),
            ("batch_multiple", batch_multiple, 1),
            ("token_alignment", token_alignment, 1),
            ("accumulate", accumulate, 1),
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
        if buckets is not None and (
            isinstance(buckets, bool) or not isinstance(buckets, numbers.Integral) or not 1 <= buckets <= 64
        ):
            raise ValueError(f"`buckets` must be an integer from 1 to 64, or None. Received: buckets={buckets!r}")
        index, count = shard
        if not (0 <= index < count) or batch_multiple % count:
            raise ValueError(
                f"`shard` must be (index, count) with 0 <= index < count, and count must divide "
                f"batch_multiple. Received: shard={shard!r}, batch_multiple={batch_multiple}"
            )
        self.pairs = pairs
        self.sampling = sampling
        self.tokens_per_batch = tokens_per_batch
        self.max_length = max_length
        self.shuffle = shuffle
        self.repeat = repeat
        self.seed = int(np.random.randint(2**31)) if seed is None else int(seed)
        self.shard = (index, count)
        self.accumulate = int(accumulate)
        self._update_tokens = (None, 0)  # (update, its target tokens): the last counted
        self.vocabulary_size = pairs.vocabulary_size
        if buckets is None:
            self.lengths = np.array(bucket_lengths(max_length, step=bucket_step), np.int64)
        else:
            histogram = _length_histogram(pairs, max_length, self._room(max_length))
            # Every pair too long: `_buckets` says so below.
            fitted = fitted_bucket_lengths(histogram, buckets) if histogram.any() else [max_length]
            self.lengths = np.array(fitted, np.int64)
        self.batch_sizes = np.array(
            [
                batch_multiple * max(1, aligned_rows(tokens_per_batch // n // batch_multiple, n, token_alignment))
                for n in self.lengths
            ]
        )
        self._bucket, self.pairs_per_bucket, too_long, shortest = _buckets(pairs, self.lengths, self._room(max_length))
        if too_long == len(pairs):
            raise ValueError(
                f"Every pair is longer than max_length={max_length} subword tokens "
                f"(EOS or BOS included), so no batch can be made. The shortest "
                f"pair has {shortest} tokens."
            )
        if too_long:
            warnings.warn(
                f"Batching leaves out {too_long} of {len(pairs)} pairs "
                f"({too_long / len(pairs):.1%}) with a side longer than "
                f"max_length={max_length} subword tokens.",
                stacklevel=2,
            )
        self._bucket_ends = np.cumsum(self.pairs_per_bucket)  # where each ends in a plan's order
        self.left_out = too_long
        self.batches_per_epoch = int(sum(-(-n // size) for n, size in zip(self.pairs_per_bucket, self.batch_sizes)))
        self._start = 0
        self._epoch = 0  # without `repeat`: which epoch `model.fit` is in
        self._plans = {}
        self._guard = threading.Lock()

    def _room(self, max_length):
        """The length a pair is bucketed by, from its own: with sampling,
        room for the longer segmentations drawn (`SubwordSampling.room`),
        up to `max_length`; else its own."""
        if self.sampling is None:
            return None
        return lambda lengths: np.where(
            lengths <= max_length, np.minimum(self.sampling.room(lengths), max_length), lengths
        ).astype(lengths.dtype)

    @property
    def longest(self):
        """The length of the longest batches: the longest bucket holding pairs."""
        return int(self.lengths[self.pairs_per_bucket > 0].max())

    # === Which pairs make batch k ===

    @property
    def num_batches(self):
        return None if self.repeat else self.batches_per_epoch - self._start

    def __len__(self):
        if self.repeat:
            raise TypeError("Batches that repeat without end have no length.")
        return self.batches_per_epoch - self._start

    def on_epoch_end(self):
        self._epoch += 1

    def starting_at(self, step):
        """The same batches, from batch `step` on: what a resumed run sees."""
        resumed = copy.copy(self)
        resumed._start = self._start + int(step)
        return resumed

    def _plan(self, epoch):
        """Epoch `epoch`'s pairs, grouped into batches.

        Returns:
            `(order, starts, buckets)`: order int32 `[pairs kept]` holds pair
            indices; batch i is `order[starts[i]:starts[i] + size]` of
            bucket `buckets[i]`.
        """
        with self._guard:
            if epoch not in self._plans:
                self._plans = {}  # one epoch's plan held at a time
                self._plans[epoch] = self._make_plan(epoch)
            return self._plans[epoch]

    def _make_plan(self, epoch):
        seed = [self.seed, epoch] if self.shuffle else None
        order = np.empty(int(self.pairs_per_bucket.sum()), np.int32)
        starts, buckets = [], []
        position = 0
        for bucket, count in enumerate(self.pairs_per_bucket):
            if not count:
                continue
            members = np.flatnonzero(self._bucket == bucket).astype(np.int32)
            if self.shuffle:
                np.random.default_rng([*seed, bucket]).shuffle(members)
            order[position : position + count] = members
            starts.append(position + np.arange(0, count, self.batch_sizes[bucket]))
            buckets.append(np.full(len(starts[-1]), bucket, np.int32))
            position += count
        starts, buckets = np.concatenate(starts), np.concatenate(buckets)
        if self.shuffle:
            batch_order = np.random.default_rng(seed).permutation(len(starts))
            starts, buckets = starts[batch_order], buckets[batch_order]
        return order, starts, buckets

    def _epoch_and_step(self, index):
        step = self._start + index
        if self.repeat:
            return divmod(step, self.batches_per_epoch)
        if step >= self.batches_per_epoch:
            raise IndexError(f"Batch {index} of an epoch of {self.batches_per_epoch}.")
        return self._epoch, step

    def pair_indices(self, index):
        """The pairs of item `index` (global batch rows, before sharding),
        and its bucket."""
        return self._pair_indices(*self._epoch_and_step(index))

    def _pair_indices(self, epoch, step):
        order, starts, buckets = self._plan(epoch)
        bucket = buckets[step]
        size, end = self.batch_sizes[bucket], self._bucket_ends[bucket]
        if not self.repeat:  # a bucket's last batch: its pairs, then padding
            return order[starts[step] : min(starts[step] + size, end)], bucket
        # An endless stream fills a bucket's last batch from the bucket's
        # first pairs of this epoch: no rows of padding to train on.
        count = self.pairs_per_bucket[bucket]
        begin = end - count
        return order[begin + (np.arange(starts[step] - begin, starts[step] - begin + size) % count)], bucket

    # === Ids ===

    def __getitem__(self, index):
        return self._batch(*self._epoch_and_step(index))

    def _batch(self, epoch, step):
        members, bucket = self._shard_members(epoch, step)
        rows, columns = int(self.batch_sizes[bucket]) // self.shard[1], int(self.lengths[bucket])
        sides = {side: self.pairs.gather(side, members) for side in ("source", "target")}
        if self.sampling is not None:  # within the bucket's length, with EOS or BOS
            sides = {
                side: self.sampling.resample(*ids, columns - 1, seed=(self.seed, epoch, step, index))
                for index, (side, ids) in enumerate(sides.items())
            }
        source_ids, _ = _padded(*sides["source"], rows, columns)
        target_ids, labels = _padded(*sides["target"], rows, columns, decoder=True)
        batch = _as_batch(source_ids, target_ids, labels)
        if self.accumulate == 1:
            return batch
        # Per token: Keras weighs the loss's `[batch, length]` values by them.
        return (*batch, np.full((rows, columns), self._loss_weight(epoch, step, members), np.float32))

    def _shard_members(self, epoch, step):
        """This process's rows of batch `step` of `epoch`, and its bucket."""
        members, bucket = self._pair_indices(epoch, step)
        shard, shards = self.shard
        share = int(self.batch_sizes[bucket]) // shards
        return members[shard * share : (shard + 1) * share], bucket

    def _target_tokens(self, members):
        """The labels' real tokens of these pairs: each target and its EOS."""
        return int(self.pairs.target_lengths[members].sum(dtype=np.int64)) + len(members)

    def _loss_weight(self, epoch, step, members):
        """N times this batch's share of its update's target tokens: the
        loss is a mean over the batch's tokens, and Keras averages the N
        batches' gradients."""
        absolute = epoch * self.batches_per_epoch + step if self.repeat else step
        first = absolute - absolute % self.accumulate
        last = first + self.accumulate if self.repeat else min(first + self.accumulate, self.batches_per_epoch)
        # The update's tokens, counted once for its N batches (asked for in turn).
        update = (None if self.repeat else epoch, first)
        counted, total = self._update_tokens
        if counted != update:
            total = 0
            for other in range(first, last):
                other_epoch, other_step = divmod(other, self.batches_per_epoch) if self.repeat else (epoch, other)
                total += self._target_tokens(self._shard_members(other_epoch, other_step)[0])
            self._update_tokens = (update, total)
        return (last - first) * self._target_tokens(members) / max(total, 1)

    def as_tf_dataset(self):
        """The same batches as a `tf.data.Dataset`, for the TensorFlow backend.

        Keras's own adapter fixes the batch shape its first two batches
        have, and buckets differ in length; here both dimensions stay free.
        Without `repeat`, each pass over the dataset is the next epoch.
        """
        import tensorflow as tf

        def batches():
            if self.repeat:
                yield from map(self.__getitem__, itertools.count())
            else:
                epoch, self._epoch = self._epoch, self._epoch + 1
                for step in range(self._start, self.batches_per_epoch):
                    yield self._batch(epoch, step)

        ids = tf.TensorSpec([None, None], tf.int32)
        signature = ({"source_ids": ids, "target_ids": ids}, ids)
        if self.accumulate > 1:
            signature += (tf.TensorSpec([None, None], tf.float32),)
        dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
        if not self.repeat:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(self)))
        # No autotuning: tearing down an autotuned iterator at an epoch's end
        # could leave `fit` idle for seconds on a small machine.
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.prefetch(2).with_options(options)


def _length_histogram(pairs, max_length, room=None, chunk=1 << 22):
    """int64 `[max_length + 1]`: how many pairs have each length up to
    `max_length`."""
    histogram = np.zeros(2**16 + 1, np.int64)
    for start in range(0, len(pairs), chunk):
        lengths = pairs.pair_lengths(start, start + chunk)
        histogram += np.bincount(lengths if room is None else room(lengths), minlength=len(histogram))
    return histogram[: max_length + 1]


def _buckets(pairs, lengths, room=None, chunk=1 << 22):
    """Each pair's bucket, a chunk of pairs at a time.

    Returns:
        `(bucket, pairs_per_bucket, too_long, shortest)`: bucket is uint8
        `[pairs]`, `len(lengths)` for a pair longer than the longest bucket.
    """
    # The bucket of every length a pair can have, looked up in place.
    table = np.searchsorted(lengths, np.arange(2**16 + 1)).astype(np.uint8)
    bucket = np.empty(len(pairs), np.uint8)
    counts = np.zeros(len(lengths) + 1, np.int64)
    shortest = 2**16
    for start in range(0, len(pairs), chunk):
        pair_lengths = pairs.pair_lengths(start, start + chunk)
        pair_lengths = pair_lengths if room is None else room(pair_lengths)
        np.take(table, pair_lengths, out=bucket[start : start + chunk])
        counts += np.bincount(bucket[start : start + chunk], minlength=len(counts))
        shortest = min(shortest, int(pair_lengths.min()))
    pairs.release_pages()
    return bucket, counts[:-1], int(counts[-1]), shortest


def _as_batch(source_ids, target_ids, labels):
    """A batch as the model's `fit` takes it: its inputs by name, and the labels."""
    return {"source_ids": source_ids, "target_ids": target_ids}, labels


def _padded(values, n, rows, columns, decoder=False):
    """`[rows, columns]` int32 ids of sentences, then rows of padding.

    Args:
        values: the sentences' ids, one after another.
        n: int64, each sentence's length.

    Returns:
        Without `decoder`: (ids + EOS, None); with it: (BOS + ids,
        ids + EOS).
    """
    ends = np.cumsum(n)
    row = np.repeat(np.arange(len(n)), n)
    column = np.arange(ends[-1] if len(n) else 0) - np.repeat(ends - n, n)
    values = values.astype(np.int32)
    members_rows = np.arange(len(n))
    with_eos = np.zeros((rows, columns), np.int32)
    with_eos[row, column] = values
    with_eos[members_rows, n] = EOS_ID
    if not decoder:
        return with_eos, None
    with_bos = np.zeros((rows, columns), np.int32)
    with_bos[members_rows, 0] = BOS_ID
    with_bos[row, column + 1] = values
    return with_bos, with_eos
