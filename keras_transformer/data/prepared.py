"""Parallel text tokenized once and kept as memory-mapped NumPy arrays.

A corpus of the paper's size (4.5 or 36 million pairs) does not fit in a
Python list of strings, and tokenizing it again at every run or resume
costs minutes. `prepare_dataset` streams the text files once and writes,
per side, the subword ids of every sentence one after the other, where each
sentence starts (offsets) and how long it is (lengths). Training then maps
these files (`load_prepared`, with `mmap`), so its memory holds one small length per
pair, not the text.

Why raw NumPy arrays: they need nothing beyond NumPy on any backend, a
pair is two slices of a file the operating system pages in on demand, and
the layout is four flat arrays a reader can check with `np.fromfile`. Ids
are uint16 when the vocabulary fits (two bytes a token), else int32.

A directory holds:

- `source.ids`, `target.ids`: the ids, without BOS or EOS;
- `source.offsets`, `target.offsets`: int64, pairs + 1 entries;
- `source.lengths`, `target.lengths`: uint16, one entry a pair;
- `manifest.json`, written last: the vocabulary's fingerprint, the counts,
  the files read, and the pairs left out and why. A directory without it
  is a preparation that did not finish.
"""

import contextlib
import dataclasses
import gzip
import itertools
import json
import mmap
import os
import threading
import time
import zlib

import numpy as np

from keras_transformer.data.corpus import read_json_object
from keras_transformer.files import CannotWrite
from keras_transformer.files import atomic_path
from keras_transformer.files import write_atomically
from keras_transformer.data.held_out import HeldOut
from keras_transformer.data.tokenizer import SubwordTokenizer

MANIFEST_FILE = "manifest.json"
FORMAT = "keras-transformer-prepared-1"
SIDES = ("source", "target")
# The most subword tokens a stored sentence may have: its length is uint16.
MAX_STORED_LENGTH = 2**16 - 2
CHUNK_PAIRS = 1 << 16
# A prepared set up to this size is read through its mapping, and may stay
# mapped whole; a larger one with a read call a sentence.
MAPPED_WHOLE_BYTES = 256 << 20
# Such a set keeps, per side, where every BLOCK_PAIRS-th sentence starts.
BLOCK_PAIRS = 64
# SentencePiece learns a vocabulary from at most this many pairs.
VOCABULARY_SAMPLE_PAIRS = 2_500_000


@dataclasses.dataclass
class TokenizedPairs:
    """Sentence pairs as subword ids: flat arrays, in memory or mapped.

    Attributes:
        source_ids, target_ids: every sentence's ids, one after another.
        source_offsets, target_offsets: int64 `[pairs + 1]`, where each
            sentence starts in the ids.
        source_lengths, target_lengths: uint16 `[pairs]`, ids a sentence.
        vocabulary_size: the ids are below this.
        manifest: what `prepare_dataset` recorded, or None in memory.
        mappings: the `mmap.mmap`s the arrays of a prepared set read.
        files: the open descriptors of a prepared set's files, by name.
    """

    source_ids: np.ndarray
    source_offsets: np.ndarray
    source_lengths: np.ndarray
    target_ids: np.ndarray
    target_offsets: np.ndarray
    target_lengths: np.ndarray
    vocabulary_size: int
    manifest: dict = None
    mappings: list = dataclasses.field(default_factory=list)  # of a prepared set
    files: dict = dataclasses.field(default_factory=dict)  # its descriptors, by file name
    blocks: dict = dataclasses.field(default_factory=dict)  # per side: (lengths, block starts)
    _guard: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def __len__(self):
        return len(self.source_lengths)

    def pair_lengths(self, start=0, end=None):
        """uint16: the longer side of pairs `start` to `end`, with its EOS
        (or BOS)."""
        return np.maximum(self.source_lengths[start:end], self.target_lengths[start:end]) + np.uint16(1)

    def gather(self, side, members):
        """The ids of pairs `members` on `side`, one sentence after another,
        and int64 lengths.

        A prepared set over `MAPPED_WHOLE_BYTES` is read with `os.pread`,
        not through its mapping: the operating system maps the pages around
        each one touched, so random batches would soon count the whole set
        as this process's memory. A sentence is one read: where it starts
        comes from the lengths, held in memory, and a start every
        `BLOCK_PAIRS` pairs.
        """
        offsets, ids = getattr(self, f"{side}_offsets"), getattr(self, f"{side}_ids")
        if not self._read_by_pread():
            starts = offsets[members]
            n = offsets[members + 1] - starts
            column = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
            return ids[np.repeat(starts, n) + column], n
        lengths, block_starts = self._blocks(side)
        members = np.asarray(members, np.int64)
        first = members - members % BLOCK_PAIRS
        column = np.arange(BLOCK_PAIRS)
        before = lengths[np.minimum(first[:, None] + column, len(lengths) - 1)]
        starts = block_starts[members // BLOCK_PAIRS] + np.where(
            column < (members - first)[:, None], before, 0
        ).sum(1, dtype=np.int64)
        n = lengths[members].astype(np.int64)
        file, width = self.files[f"{side}.ids"], ids.itemsize
        chunks = [os.pread(file, width * k, width * a) for a, k in zip(starts.tolist(), n.tolist())]
        return np.frombuffer(b"".join(chunks), ids.dtype), n

    def _blocks(self, side):
        """`side`'s lengths, copied into memory, and int64 where each block
        of `BLOCK_PAIRS` pairs starts; built at the first read."""
        with self._guard:
            if side not in self.blocks:
                lengths = np.array(getattr(self, f"{side}_lengths"))
                chunks = (lengths[a : a + CHUNK_PAIRS] for a in range(0, len(lengths), CHUNK_PAIRS))
                # A chunk at a time: no int64 copy of every length.
                sums = [np.add.reduceat(c, np.arange(0, len(c), BLOCK_PAIRS), dtype=np.int64) for c in chunks]
                block_starts = np.concatenate([[0], np.cumsum(np.concatenate(sums))])
                total = int(getattr(self, f"{side}_offsets")[-1])
                if block_starts[-1] != total:
                    raise ValueError(
                        f"The {side} lengths add up to {block_starts[-1]} ids; the offsets say {total}. "
                        "The prepared dataset is damaged: prepare it again."
                    )
                self.blocks[side] = lengths, block_starts
                self.release_pages()
            return self.blocks[side]

    def _read_by_pread(self):
        return bool(self.files) and sum(map(len, self.mappings)) > MAPPED_WHOLE_BYTES

    def read_ahead(self, chunk=8 << 20):
        """Reads the ids files once through, in file order, in a background
        thread, when they fit in half the memory available: they are then
        in the operating system's page cache. A batch's sentences read at
        random from a cold disk arrive one seek at a time (about 15,000
        target tokens/s on this project's machine), from the page cache at
        millions. (`posix_fadvise`'s WILLNEED read nothing here.)
        """
        names = [f"{side}.ids" for side in SIDES if f"{side}.ids" in self.files]
        sizes = [os.fstat(self.files[name]).st_size for name in names]
        if not names or sum(sizes) > _available_memory() // 2:
            return None

        def read():
            buffer = bytearray(chunk)
            for name, size in zip(names, sizes):
                for start in range(0, size, chunk):
                    try:
                        os.preadv(self.files[name], [buffer], start)
                    except OSError:  # closed meanwhile: nothing left to read
                        return

        thread = threading.Thread(target=read, name="read-ahead", daemon=True)
        thread.start()
        return thread

    def release_pages(self):
        """Unmaps the pages of the files read so far (they stay in the page
        cache), after a pass over the lengths."""
        for mapping in self.mappings:
            mapping.madvise(mmap.MADV_DONTNEED)


def _available_memory():
    """Bytes of memory available without swapping (Linux's MemAvailable),
    or 0 where the system does not say."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return 0


def id_dtype(vocabulary_size):
    return np.uint16 if vocabulary_size <= 2**16 else np.int32


def _flat(id_lists, dtype):
    """The ids of several sentences, one after another, and their lengths."""
    lengths = np.fromiter(map(len, id_lists), np.int64, count=len(id_lists))
    ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype, count=int(lengths.sum()))
    return ids, lengths


def tokenize_pairs(sources, targets, tokenizer):
    """`TokenizedPairs` in memory, for a corpus that fits there."""
    arrays = {}
    for side, texts, tokenize in zip(SIDES, (sources, targets), (tokenizer.tokenize, tokenizer.tokenize_target)):
        ids, lengths = _flat(tokenize(list(texts)), id_dtype(tokenizer.vocabulary_size))
        if len(lengths) and lengths.max() > MAX_STORED_LENGTH:
            raise ValueError(
                f"A {side} sentence has {int(lengths.max())} subword tokens; at most "
                f"{MAX_STORED_LENGTH} are expected. Leave such sentences out first."
            )
        arrays[f"{side}_ids"] = ids
        arrays[f"{side}_offsets"] = np.concatenate([[0], np.cumsum(lengths)])
        arrays[f"{side}_lengths"] = lengths.astype(np.uint16)
    return TokenizedPairs(**arrays, vocabulary_size=tokenizer.vocabulary_size)


def _open_text(path):
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def _read_pairs(source_path, target_path, chunk_pairs):
    """Lists of (source, target) lines, read as a stream."""
    with _open_text(source_path) as source_file, _open_text(target_path) as target_file:
        chunk = []
        lines = itertools.zip_longest(source_file, target_file)
        for number, (source, target) in enumerate(lines, start=1):
            if source is None or target is None:
                shorter = source_path if source is None else target_path
                raise ValueError(
                    f"Parallel files must have one line per sentence pair, but {shorter} "
                    f"ends after {number - 1} lines and the other goes on "
                    f"({source_path} | {target_path})."
                )
            chunk.append((_decode(source, source_path, number), _decode(target, target_path, number)))
            if len(chunk) == chunk_pairs:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def read_pairs(source_paths, target_paths, chunk_pairs=CHUNK_PAIRS):
    """Chunks of (source, target) lines of several file pairs, in turn;
    damaged files are a `ValueError` naming them."""
    for source_path, target_path in zip(source_paths, target_paths):
        try:
            yield from _read_pairs(source_path, target_path, chunk_pairs)
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(f"Cannot read {source_path} | {target_path}: {error}") from None


def sample_pairs(chunks, count, seed=0):
    """At most `count` pairs with two non-blank sides, drawn uniformly from
    a stream (reservoir sampling); all of them, in order, if fewer."""
    rng = np.random.default_rng(seed)
    sample, seen = [], 0
    for chunk in chunks:
        for pair in chunk:
            if not (pair[0].strip() and pair[1].strip()):
                continue
            seen += 1
            if len(sample) < count:
                sample.append(pair)
            else:
                slot = rng.integers(seen)
                if slot < count:
                    sample[slot] = pair
    return sample


def train_vocabulary(source_paths, target_paths, vocabulary_size, seed=0):
    """A shared vocabulary learned from a uniform sample of at most
    `VOCABULARY_SAMPLE_PAIRS` pairs of the files, read as a stream."""
    pairs = sample_pairs(read_pairs(source_paths, target_paths), VOCABULARY_SAMPLE_PAIRS, seed)
    if not pairs:
        raise ValueError(
            f"The files hold no pair with two non-empty sides: {list(source_paths)} | {list(target_paths)}."
        )
    return SubwordTokenizer.train(pairs, vocabulary_size, seed=seed)


def _decode(raw, path, number):
    try:
        return raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}:{number}: invalid UTF-8 at byte {error.start} of the line. "
            "Expected UTF-8 text; convert the file (for example with iconv) first."
        ) from None


def prepare_dataset(
    source_paths, target_paths, tokenizer, directory, chunk_pairs=CHUNK_PAIRS, log=None, held_out=None
):
    """Tokenizes parallel files once into `directory`, as a stream.

    Memory stays that of one chunk of pairs, whatever the corpus size;
    SentencePiece tokenizes each chunk on every core. Pairs with an empty
    (or blank) side, or with a side over 65,534 subword tokens, are left
    out and counted in the manifest.

    Args:
        source_paths, target_paths: line-aligned files (plain or .gz), read
            one pair of files after the other.
        tokenizer: the `SubwordTokenizer` whose ids are stored.
        directory: where the arrays and `manifest.json` go.
        chunk_pairs: pairs tokenized at a time.
        log: a function for one progress line per file, or None.
        held_out: the fraction of pairs to hold out for validation, as
            text in `directory` (`keras_transformer.data.held_out`), or None.

    Returns:
        The prepared `TokenizedPairs`, mapped from `directory`.
    """
    if isinstance(source_paths, (str, os.PathLike)):
        source_paths, target_paths = [source_paths], [target_paths]
    if len(source_paths) != len(target_paths) or not source_paths:
        raise ValueError(
            "prepare_dataset needs as many source files as target files (at least one). "
            f"Received: {list(source_paths)} and {list(target_paths)}"
        )
    os.makedirs(directory, exist_ok=True)
    manifest_path = os.path.join(directory, MANIFEST_FILE)
    if os.path.exists(manifest_path):
        os.remove(manifest_path)  # the old arrays are about to change
    dtype = id_dtype(tokenizer.vocabulary_size)
    totals = dict.fromkeys(SIDES, 0)
    read, left_out, started = [], {"empty_side": 0, "too_long": 0}, time.time()
    if held_out is not None:
        held_out = HeldOut(directory, held_out)
    with contextlib.ExitStack() as stack:  # each array file renamed into place at the end
        files = {
            name: stack.enter_context(open(stack.enter_context(atomic_path(os.path.join(directory, name))), "wb"))
            for name in _array_files()
        }
        if held_out is not None:
            stack.enter_context(held_out)
        try:
            for side in SIDES:
                np.zeros(1, np.int64).tofile(files[f"{side}.offsets"])
            line = 0
            for source_path, target_path in zip(source_paths, target_paths):
                entry = {"source": os.fspath(source_path), "target": os.fspath(target_path), "lines": 0, "pairs": 0}
                for chunk in read_pairs([source_path], [target_path], chunk_pairs):
                    entry["lines"] += len(chunk)
                    line += len(chunk)
                    if held_out is not None:
                        chunk = held_out.take(chunk, line - len(chunk))
                    kept = [(s, t) for s, t in chunk if s.strip() and t.strip()]
                    left_out["empty_side"] += len(chunk) - len(kept)
                    if kept:
                        kept_pairs = _write_chunk(kept, tokenizer, dtype, files, totals)
                        left_out["too_long"] += len(kept) - kept_pairs
                        entry["pairs"] += kept_pairs
                read.append(entry)
                if log:
                    log(f"prepared {source_path} | {target_path}: {entry['pairs']:,} pairs of "
                        f"{entry['lines']:,} lines ({time.time() - started:.0f}s)")
        except OSError as error:
            if isinstance(error, CannotWrite) or error.filename is not None:
                raise  # named already: a file read, or written
            raise CannotWrite(directory, error) from None  # a write of the arrays (a full disk)
    pairs = sum(entry["pairs"] for entry in read)
    manifest = {
        "format": FORMAT,
        "vocabulary_fingerprint": tokenizer.fingerprint(),
        "vocabulary_size": tokenizer.vocabulary_size,
        "id_dtype": np.dtype(dtype).name,
        "pairs": pairs,
        "source_tokens": totals["source"],
        "target_tokens": totals["target"],
        "left_out": left_out,
        "files": read,
        "seconds": round(time.time() - started, 1),
    }
    if held_out is not None:
        manifest["held_out"] = held_out.summary()
    write_atomically(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return _map_prepared(directory, tokenizer)  # just written: in the page cache already


def _write_chunk(pairs, tokenizer, dtype, files, totals):
    """Appends a chunk's ids, offsets and lengths; returns the pairs kept."""
    sources, targets = zip(*pairs)
    sides = [_flat(tokenizer.tokenize(sources), dtype), _flat(tokenizer.tokenize_target(targets), dtype)]
    fits = (sides[0][1] <= MAX_STORED_LENGTH) & (sides[1][1] <= MAX_STORED_LENGTH)
    for side, (ids, lengths) in zip(SIDES, sides):
        if not fits.all():
            ends = np.cumsum(lengths)
            ids = np.concatenate([ids[e - n : e] for e, n, f in zip(ends, lengths, fits) if f])
            lengths = lengths[fits]
        ids.tofile(files[f"{side}.ids"])
        (totals[side] + np.cumsum(lengths)).tofile(files[f"{side}.offsets"])
        lengths.astype(np.uint16).tofile(files[f"{side}.lengths"])
        totals[side] += int(lengths.sum())
    return int(fits.sum())


def _array_files():
    return [f"{side}.{part}" for side in SIDES for part in ("ids", "offsets", "lengths")]


def is_prepared(directory):
    """Whether `directory` holds a finished preparation."""
    return os.path.isfile(os.path.join(directory, MANIFEST_FILE))


def load_prepared(directory, tokenizer=None):
    """Maps a prepared dataset; with `tokenizer`, checks it made the ids.
    Its ids files are read ahead (`TokenizedPairs.read_ahead`).

    Returns:
        `TokenizedPairs` of read-only arrays over memory maps, with its
        `manifest`.
    """
    prepared = _map_prepared(directory, tokenizer)
    prepared.read_ahead()
    return prepared


def _map_prepared(directory, tokenizer):
    manifest_path = os.path.join(directory, MANIFEST_FILE)
    if not os.path.isfile(manifest_path):
        raise FileNotFoundError(
            f"No prepared dataset in {directory}: expected {MANIFEST_FILE}, which "
            "`keras-transformer prepare` writes last (a preparation cut short has none)."
        )
    manifest = read_json_object(manifest_path)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path}: format {manifest.get('format')!r}; expected {FORMAT!r}.")
    if tokenizer is not None and manifest.get("vocabulary_fingerprint") != tokenizer.fingerprint():
        raise ValueError(
            f"{directory} was prepared with another vocabulary (fingerprint "
            f"{manifest.get('vocabulary_fingerprint')}, this one's is {tokenizer.fingerprint()}). "
            "Prepare it again with this vocabulary."
        )
    pairs = manifest["pairs"]
    sizes = {"ids": None, "offsets": pairs + 1, "lengths": pairs}
    dtypes = {"ids": np.dtype(manifest["id_dtype"]), "offsets": np.int64, "lengths": np.uint16}
    arrays, mappings, files = {}, [], {}
    for side in SIDES:
        sizes["ids"] = manifest[f"{side}_tokens"]
        for part in sizes:
            path = os.path.join(directory, f"{side}.{part}")
            expected = sizes[part] * np.dtype(dtypes[part]).itemsize
            actual = os.path.getsize(path) if os.path.isfile(path) else None
            if actual != expected:
                raise ValueError(
                    f"{path} holds {actual} bytes; the manifest expects {expected}. "
                    "The prepared dataset is damaged: prepare it again."
                )
            if not expected:  # a zero-size file cannot be mapped
                arrays[f"{side}_{part}"] = np.zeros(0, dtypes[part])
                continue
            files[f"{side}.{part}"] = os.open(path, os.O_RDONLY)
            mappings.append(mmap.mmap(files[f"{side}.{part}"], 0, access=mmap.ACCESS_READ))
            arrays[f"{side}_{part}"] = np.frombuffer(mappings[-1], dtypes[part])
    return TokenizedPairs(
        **arrays, vocabulary_size=manifest["vocabulary_size"], manifest=manifest, mappings=mappings, files=files
    )
