"""Between a published model's token ids and ours.

Our ids 0 to 3 are padding, unknown, BOS (where decoding starts) and EOS,
in the loss, the batches, the search and the export alike. A published
model numbers its special tokens its own way (Marian: EOS 0, padding
last, decoding from padding; fairseq: <s> 0, padding 1, EOS 2, decoding
from EOS), so a converter reorders its rows into ours and its tokenizer
maps ids both ways. Where decoding starts from a token that is also an
input or an output (padding, EOS), our BOS is a copy of that row: one id
more than the published vocabulary.
"""

import numpy as np

OUR_SPECIAL_IDS = ("padding", "unknown", "start", "eos")


class IdMap:
    """The permutation from published ids to ours.

    Ours are `[padding, unknown, start, eos]` followed by every other
    published id in its order.

    Args:
        size: the published vocabulary's size (the larger side's when the
            source and target vocabularies differ).
        padding, unknown, start, eos: the published special ids.
    """

    def __init__(self, size, padding, unknown, start, eos):
        self.size = int(size)
        self.special = {"padding": int(padding), "unknown": int(unknown), "start": int(start), "eos": int(eos)}
        for name, value in self.special.items():
            if not 0 <= value < self.size:
                raise ValueError(
                    f"The published {name} id must be below the vocabulary size {self.size}. Received: {name}={value}"
                )
        leading = [self.special[name] for name in OUR_SPECIAL_IDS]
        rest = np.setdiff1d(np.arange(self.size), leading)
        self.published_of_ours = np.concatenate([np.array(leading), rest]).astype(np.int64)  # [ours]
        # A published id that is two of ours (decoding's start and padding
        # or EOS) reads as the one that is not our BOS.
        self.ours_of_published = np.full(self.size, -1, np.int64)
        for ours in range(len(self.published_of_ours) - 1, -1, -1):
            if ours != 2 or self.ours_of_published[self.published_of_ours[ours]] < 0:
                self.ours_of_published[self.published_of_ours[ours]] = ours
        self.start_is_copy = self.special["start"] in (self.special["padding"], self.special["eos"], self.special["unknown"])

    @property
    def vocabulary_size(self):
        """Our vocabulary's size."""
        return len(self.published_of_ours)

    def rows(self, matrix, fill=0.0):
        """`matrix`'s rows (published ids first) in our order; rows past
        `matrix`'s end (the smaller of two vocabularies) are `fill`."""
        matrix = np.asarray(matrix)
        # One copy of the matrix, not two: converting holds it beside the model.
        rows = np.take(matrix, np.minimum(self.published_of_ours, len(matrix) - 1), axis=0)
        rows[self.published_of_ours >= len(matrix)] = fill
        return rows

    @property
    def start_reads_as(self):
        """Our id of the token decoding starts from, as the published model
        reads it in an output (its padding or EOS, where our BOS copies it):
        the token a repetition penalty counts it as."""
        return int(self.ours_of_published[self.special["start"]])

    def to_ours(self, ids):
        return self.ours_of_published[np.asarray(ids, np.int64)].tolist()

    def to_published(self, ids):
        return self.published_of_ours[np.asarray(ids, np.int64)].tolist()

    def get_config(self):
        return {"size": self.size, **self.special}

    @classmethod
    def from_config(cls, config):
        return cls(**{name: config[name] for name in ("size", "padding", "unknown", "start", "eos")})
