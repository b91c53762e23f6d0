"""Validation pairs held out of the training files, for a corpus that comes
as one pair of files.

Pair i (counting every line of the files, one pair of files after the other)
is held out when a hash of (seed, i) falls below the fraction: the same
pairs for the same files and seed, whatever the chunking, without holding
the corpus in memory.
"""

import contextlib
import numbers
import os

import numpy as np

from keras_transformer.files import atomic_path

SOURCE_FILE = "held_out.source"
TARGET_FILE = "held_out.target"


def is_held_out(indices, fraction, seed):
    """bool `[n]`: which pair indices are held out (splitmix64 of seed and
    index, compared with the fraction)."""
    with np.errstate(over="ignore"):  # the hash multiplies modulo 2**64
        # Index + 1: splitmix64 maps 0 to 0, which every fraction would hold out.
        x = (np.asarray(indices, np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        x = x + np.uint64(seed) * np.uint64(0xD1B54A32D192ED03)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)) < np.uint64(fraction * 2**53)


def check_fraction(fraction):
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction < 1:
        raise ValueError(
            f"The held-out fraction must be a number between 0 and 1 (both excluded). Received: {fraction!r}"
        )


class HeldOut:
    """Takes the held-out pairs out of chunks of a stream and writes them,
    as text, to `held_out.source` and `held_out.target` in `directory`.

    A context manager: the files appear, renamed into place, when the
    stream ends without error.
    """

    def __init__(self, directory, fraction, seed=0):
        check_fraction(fraction)
        self.directory, self.fraction, self.seed = directory, float(fraction), int(seed)
        self.pairs = 0
        self._stack = None
        self._files = None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        paths = [os.path.join(self.directory, name) for name in (SOURCE_FILE, TARGET_FILE)]
        self._files = [
            self._stack.enter_context(open(self._stack.enter_context(atomic_path(path)), "w", encoding="utf-8"))
            for path in paths
        ]
        return self

    def __exit__(self, *exception):
        return self._stack.__exit__(*exception)

    def take(self, chunk, first):
        """The pairs of `chunk` (pairs `first`, `first + 1`, ...) that stay
        for training; the others are written out."""
        held = is_held_out(np.arange(first, first + len(chunk)), self.fraction, self.seed)
        for (source, target), out in zip(chunk, held):
            if out:  # one line each: a pair with a line break in it stays aligned
                self._files[0].write(" ".join(source.splitlines()) + "\n")
                self._files[1].write(" ".join(target.splitlines()) + "\n")
        self.pairs += int(held.sum())
        return [pair for pair, out in zip(chunk, held) if not out]

    def summary(self):
        return {"fraction": self.fraction, "seed": self.seed, "pairs": self.pairs,
                "source": SOURCE_FILE, "target": TARGET_FILE}
