"""Parallel text: line-aligned source and target files, plain or gzipped."""

import collections.abc
import dataclasses
import gzip
import json
import logging
import zlib

from keras_transformer.files import write_atomically  # noqa: F401 (where recipes import it)

logger = logging.getLogger("keras_transformer")


@dataclasses.dataclass(frozen=True)
class ParallelCorpus(collections.abc.Sequence):
    """A sequence of (source, target) sentence pairs, and what was left out.

    Attributes:
        sources: the source sentences.
        targets: the target sentences, aligned with `sources`.
        name: where the pairs came from.
        skipped_empty: pairs left out because a side was empty.
        filtered_too_long: pairs left out because a side was longer than the
            reader's `max_length` words.
    """

    sources: tuple
    targets: tuple
    name: str = ""
    skipped_empty: int = 0
    filtered_too_long: int = 0

    def __post_init__(self):
        if len(self.sources) != len(self.targets):
            raise ValueError(
                "A parallel corpus needs as many targets as sources. "
                f"Received: {len(self.sources)} sources and "
                f"{len(self.targets)} targets"
            )

    def __len__(self):
        return len(self.sources)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return dataclasses.replace(
                self, sources=self.sources[index], targets=self.targets[index]
            )
        return self.sources[index], self.targets[index]

    def texts(self):
        """Every sentence of both sides, for training a shared vocabulary."""
        return list(self.sources) + list(self.targets)

    def summary(self):
        """One line saying how many pairs there are and what was left out."""
        return (
            f"{self.name or 'corpus'}: {len(self)} pairs; skipped "
            f"{self.skipped_empty} with an empty side; filtered "
            f"{self.filtered_too_long} longer than the maximum length"
        )


def concatenate(corpora, name):
    """One corpus of the pairs of several, in order, with their counts summed."""
    return ParallelCorpus(
        sum((c.sources for c in corpora), ()),
        sum((c.targets for c in corpora), ()),
        name=name,
        skipped_empty=sum(c.skipped_empty for c in corpora),
        filtered_too_long=sum(c.filtered_too_long for c in corpora),
    )


def read_lines(path):
    """The lines of a UTF-8 file (gzipped if it ends in .gz), without EOLs."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as file:
            raw = file.read()
    except (OSError, EOFError, zlib.error) as error:  # zlib.error: damaged compressed bytes
        raise ValueError(f"Cannot read {path}: {error}") from None
    return decode_lines(raw, path)


def read_json_object(path):
    """The JSON object in a settings file; errors name the file."""
    try:
        with open(path, "rb") as file:
            values = json.loads(file.read())
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a JSON object; it holds {type(values).__name__}.")
    return values


def decode_lines(raw, path):
    """The UTF-8 lines of `raw` bytes; errors name `path` and the line."""
    raw_lines = raw.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the last line
    return [decode_line(raw, path, number) for number, raw in enumerate(raw_lines, start=1)]


def decode_line(raw, path, number):
    """Line `number` of `path`, UTF-8 bytes without their newline, as text."""
    try:
        return raw.rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError as error:
        context = raw[max(0, error.start - 20) : error.start + 20]
        raise ValueError(
            f"{path}:{number}: invalid UTF-8 at byte {error.start} of "
            f"the line, near {context!r}. Expected UTF-8 text; convert "
            "the file (for example with iconv) before reading it."
        ) from error


def _collect_pairs(pairs, max_length, name):
    """Keeps the pairs with two non-empty sides of at most `max_length`
    words, counting the others, and logs what it left out."""
    if max_length is not None and max_length < 1:
        raise ValueError(
            f"`max_length` must be a positive number of words or None. "
            f"Received: max_length={max_length}"
        )
    sources, targets = [], []
    skipped_empty = filtered_too_long = 0
    for source, target in pairs:
        if not source.strip() or not target.strip():
            skipped_empty += 1
        elif max_length is not None and (
            len(source.split()) > max_length or len(target.split()) > max_length
        ):
            filtered_too_long += 1
        else:
            sources.append(source)
            targets.append(target)
    corpus = ParallelCorpus(
        tuple(sources),
        tuple(targets),
        name=name,
        skipped_empty=skipped_empty,
        filtered_too_long=filtered_too_long,
    )
    if skipped_empty or filtered_too_long:
        logger.warning(corpus.summary())
    return corpus


def read_parallel_text(source_path, target_path, max_length=None):
    """Reads line-aligned parallel text, such as `train.en` and `train.de`.

    Line i of the source file translates to line i of the target file. Files
    ending in `.gz` are read through gzip. Nothing is dropped silently:

    - files with different line counts are an error naming both counts;
    - a line that is not UTF-8 is an error naming the file and line;
    - a pair with an empty (or blank) side is skipped and counted in
      `skipped_empty`;
    - a pair with a side longer than `max_length` words (separated by
      whitespace) is skipped and counted in `filtered_too_long`.

    Skipped pairs are also logged on the "keras_transformer" logger.

    Args:
        source_path: the source-language file.
        target_path: the target-language file.
        max_length: the most words either side may have, or None.

    Returns:
        A `ParallelCorpus`.
    """
    sources = read_lines(source_path)
    targets = read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            "Parallel files must have one line per sentence pair, but "
            f"{source_path} has {len(sources)} lines and {target_path} has "
            f"{len(targets)} lines."
        )
    return _collect_pairs(
        zip(sources, targets), max_length, f"{source_path} | {target_path}"
    )


def read_tfds(
    name="wmt14_translate/de-en",
    split="train",
    source_language="en",
    target_language="de",
    max_length=None,
    data_dir=None,
):
    """Reads a TFDS translation dataset, such as the paper's WMT14 En-De.

    Needs `tensorflow-datasets` (`pip install tensorflow-datasets`) and, on
    first use, the network to download and prepare the data. Pairs are
    filtered as in `read_parallel_text`.

    Args:
        name: the TFDS dataset name.
        split: the TFDS split, such as `"train"` or `"test"`.
        source_language: the feature holding the source sentences.
        target_language: the feature holding the target sentences.
        max_length: the most words either side may have, or None.
        data_dir: where TFDS keeps its data; its default when None.

    Returns:
        A `ParallelCorpus`.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise ImportError(
            f"Reading {name!r} from TFDS needs the tensorflow-datasets "
            "package: pip install tensorflow-datasets. Or read local files "
            "with read_parallel_text."
        ) from error
    from keras_transformer.environment import tensorflow_beside_backend

    # TFDS reads through TensorFlow, which would take a GPU's memory from
    # JAX or torch: its GPUs are hidden before it starts.
    tensorflow_beside_backend()
    dataset = tfds.load(name, split=split, data_dir=data_dir)
    pairs = (
        (
            example[source_language].decode("utf-8"),
            example[target_language].decode("utf-8"),
        )
        for example in dataset.as_numpy_iterator()
    )
    return _collect_pairs(pairs, max_length, f"tfds:{name}/{split}")
