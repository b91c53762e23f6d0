"""Subword regularization (Kudo, 2018): each training sentence segmented
anew, at random, every time a batch holds it; for a BPE vocabulary,
BPE-dropout (Provilkov et al., 2020). Validation and translation keep the
one segmentation."""

import numpy as np

# Draws a sentence gets to fit its batch's length.
DRAWS = 3


class SubwordSampling:
    """Draws a segmentation of each sentence of a batch from its ids.

    A sentence's ids are turned back into its text, which the tokenizer
    segments at random (`tokenizer.sample`). `TokenBatches` buckets each
    pair as if it were `room` long, so that a batch has room for the
    longer segmentations; a sentence whose draws come out longer than its
    batch's length all `DRAWS` times keeps its own segmentation. The draws follow from the batch's seed: a
    resumed run sees the batches an uninterrupted one saw.

    Args:
        tokenizer: a `SubwordTokenizer` (SentencePiece), whose `sample`
            draws segmentations.
        alpha: SentencePiece's sampling parameter: for BPE, the probability
            that a merge is left out; for a unigram model, the smoothing of
            the segmentations' probabilities.
    """

    def __init__(self, tokenizer, alpha):
        if not hasattr(tokenizer, "sample"):
            raise ValueError(
                f"Subword sampling draws SentencePiece segmentations; {type(tokenizer).__name__} has "
                "none. Expected the package's own SubwordTokenizer (a vocabulary `train` trained)."
            )
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
            raise ValueError(f"`alpha` must be a number in (0, 1]. Received: alpha={alpha!r}")
        self.tokenizer = tokenizer
        self.alpha = float(alpha)

    def room(self, lengths):
        """The lengths, EOS included, that batches leave these pairs: `1 +
        2 alpha` times theirs, for the longer segmentations drawn."""
        return np.ceil(lengths * (1.0 + 2.0 * self.alpha)).astype(np.int64)

    def resample(self, values, lengths, limit, seed):
        """`(values, lengths)` of the sentences, segmented anew: the flat
        ids and each sentence's length, as `TokenizedPairs.gather` gives
        them; each new one at most `limit` ids long."""
        ends = np.cumsum(lengths)
        kept = [values[end - n : end].tolist() for end, n in zip(ends, lengths)]
        texts = [self.tokenizer.detokenize(ids) for ids in kept]
        waiting = list(range(len(kept)))  # the sentences no draw has fitted yet
        for draw in range(DRAWS):
            drawn = self.tokenizer.sample([texts[i] for i in waiting], self.alpha, seed=_seed((*seed, draw)))
            for index, ids in zip(waiting, drawn):
                if len(ids) <= limit:
                    kept[index] = ids
            waiting = [index for index, ids in zip(waiting, drawn) if len(ids) > limit]
            if not waiting:
                break
        lengths = np.array([len(ids) for ids in kept], np.int64)
        flat = np.concatenate([np.asarray(ids, values.dtype) for ids in kept]) if kept else values[:0]
        return flat, lengths


def _seed(parts):
    """One 32-bit seed from a tuple of ints."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])
