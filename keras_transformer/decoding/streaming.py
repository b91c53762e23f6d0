"""Translating files of any size: a window of lines at a time, each written
before the next is read.

`translate_file` reads its input `window` lines at a time. Each window is
sorted by length into batches (`Translator.translate`), translated, and
its lines are appended in input order to `OUTPUT.partial`, which becomes
`OUTPUT` when the last window is written. Memory holds one window,
whatever the file's size.

A run that is killed leaves `OUTPUT.partial` and `OUTPUT.partial.json`,
which records the input, the shard and the search settings. The same
command continues it on its own: the lines already written are kept and
never translated again, after the input's first lines are checked to be
the ones translated (a hash of them). A run with another input or other
settings is refused, naming the file to remove to start over.

`--shard i/n` of the command line (`shard=(i, n)`) translates the i-th of
n consecutive parts of a file, so that n processes can share it; their
outputs, put together in order, are the whole file's translation.
"""

import contextlib
import dataclasses
import gzip
import hashlib
import itertools
import json
import os
import sys
import time
import zlib

from keras_transformer.data.corpus import decode_line
from keras_transformer.data.sentences import check_splitter
from keras_transformer.files import CannotWrite
from keras_transformer.files import write_atomically

# Lines translated together: enough to fill batches of similar lengths,
# a few megabytes of ids and text.
WINDOW_LINES = 4096
PARTIAL_SUFFIX = ".partial"
STATE_SUFFIX = ".partial.json"


def check_window(size):
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"window must be an integer >= 1 line. Received: window={size!r}")


def windows(lines, size):
    """Lists of `size` consecutive items of `lines` (the last may be shorter)."""
    check_window(size)
    window = []
    for line in lines:
        window.append(line)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def translated_windows(translator, lines, window=WINDOW_LINES, first_line=0, split_sentences=False):
    """`(sources, translations)` of each window of `lines`, in order;
    `first_line` counts the lines before them, for warnings."""
    options = {"split_sentences": True} if split_sentences else {}  # any object with translate() otherwise
    for sources in windows(lines, window):
        yield sources, translator.translate(sources, first_line=first_line, **options)
        first_line += len(sources)


def parse_shard(text):
    """`(index, count)` of a shard written "i/n", 0 <= i < n."""
    index, slash, count = str(text).partition("/")
    try:
        index, count = int(index), int(count)
    except ValueError:
        index = count = None
    if not slash or index is None or count < 1 or not 0 <= index < count:
        raise ValueError(
            f"A shard is written i/n with 0 <= i < n, such as 0/4 for the first of four. Received: {text!r}"
        )
    return index, count


@dataclasses.dataclass
class Summary:
    """What `translate_file` did: lines translated now, lines kept from an
    interrupted run, and the seconds it took."""

    translated: int
    kept: int
    seconds: float


class RawLines:
    """The lines of a UTF-8 text file (gzipped if its name ends in .gz) or of
    stdin (`None` or "-"), read one at a time, as `(number, raw bytes)`
    without the newline."""

    def __init__(self, path):
        self.path = path
        self.name = "<stdin>" if path in (None, "-") else os.fspath(path)

    def __iter__(self):
        if self.name == "<stdin>":
            yield from _numbered(sys.stdin.buffer)
            return
        opener = gzip.open if self.name.endswith(".gz") else open
        try:
            with opener(self.name, "rb") as file:
                yield from _numbered(file)
        except (OSError, EOFError, zlib.error) as error:  # zlib.error: damaged compressed bytes
            raise ValueError(f"Cannot read {self.name}: {error}") from None

    def count(self):
        """How many lines the file has (one pass over it)."""
        if self.name == "<stdin>":
            raise ValueError("Counting the lines of stdin would consume them; give the input as a file.")
        total = 0
        for total, _ in self:
            pass
        return total

    def identity(self):
        """What an interrupted output's record names as its input."""
        return self.name if self.name == "<stdin>" else os.path.abspath(self.name)


class PairedLines:
    """The aligned lines of two files (`score`'s sources and targets), as
    `(number, source + b"\\n" + target)`: no line holds a newline, so the
    pair splits back at it (`split_pair`); one file ending before the other
    is an error."""

    def __init__(self, source, target):
        self.sides = (RawLines(source), RawLines(target))
        if "<stdin>" in (side.name for side in self.sides):
            raise ValueError("Pairs are read from two files; give both as files, not stdin.")
        self.name = f"{self.sides[0].name} and {self.sides[1].name}"

    def __iter__(self):
        source, target = self.sides
        for (number, left), right in itertools.zip_longest(source, target, fillvalue=(None, None)):
            if number is None or right[0] is None:
                shorter, longer = (source, target) if number is None else (target, source)
                raise ValueError(
                    f"{shorter.name} ends before {longer.name}: it has {(number or right[0]) - 1:,} lines. "
                    "Expected one line of each file per pair."
                )
            yield number, left + b"\n" + right[1]

    def count(self):
        return self.sides[0].count()

    def identity(self):
        return [side.identity() for side in self.sides]


def split_pair(text):
    """A `PairedLines` pair's `(source, target)`, as text."""
    source, _, target = text.partition("\n")
    return source.rstrip("\r"), target


def translate_file(
    translator, source, output=None, window=WINDOW_LINES, shard=None, progress=None, settings=None, log=None,
    split_sentences=False,
):
    """Translates the lines of `source` into `output`, a window at a time.

    Args:
        translator: a `Translator`, or any object whose `translate(texts,
            first_line)` gives a line for each text (`scoring.ScoredLines`),
            or a record of `translator.lines_per_record` lines, joined by
            newlines (`output_formats.FormattedLines`).
        source: a text file (gzipped if .gz), None or "-" for stdin, or a
            `PairedLines`.
        output: the file to write, or None or "-" for stdout (written a
            window at a time, never continued).
        window: lines translated together.
        shard: `(i, n)` to translate the i-th of n consecutive parts of
            `source` (a file) alone.
        progress: a `Progress` told of each window, or None.
        settings: what must not change for a run to continue another's
            output (JSON values); the translator's search settings by
            default.
        log: called with a line that says an interrupted output is
            continued; by default the line goes to stderr.
        split_sentences: translate each line sentence by sentence
            (`Translator.translate`'s).

    Returns:
        a `Summary`.

    Raises:
        ValueError: for unreadable input or an interrupted output that
            another input or other settings wrote.
    """
    started = time.perf_counter()
    check_window(window)
    if split_sentences:
        check_splitter()
    lines = source if isinstance(source, PairedLines) else RawLines(source)
    first, end = 0, None
    if shard is not None:
        index, count = shard
        total = lines.count()
        first, end = total * index // count, total * (index + 1) // count
    if progress is not None and end is None and lines.name != "<stdin>":
        end = lines.count()
    # The shard's lines: those before it skipped, the file left at its end.
    numbered = itertools.takewhile(
        lambda item: end is None or item[0] <= end, itertools.dropwhile(lambda item: item[0] <= first, lines)
    )
    if progress is not None and end is not None:
        progress.total = end - first
    if output in (None, "-") or (os.path.exists(output) and not os.path.isfile(output)):
        # stdout, or a device or pipe (/dev/null): written as it comes, never continued.
        translated = _write_stream(translator, numbered, lines.name, window, first, progress, output, split_sentences)
        return Summary(translated, 0, time.perf_counter() - started)
    run = _Run(os.fspath(output), getattr(translator, "lines_per_record", 1), {
        "input": lines.identity(),
        "shard": list(shard) if shard is not None else None,
        "settings": translator.get_config() if settings is None else settings,
    })
    kept = run.open(numbered)
    if kept:
        (log or _to_stderr)(
            f"continuing {run.partial}: {kept:,} lines kept from an interrupted run, translating from "
            f"line {first + kept + 1:,}" + (f" to {end:,}" if end is not None else "")
        )
    if progress is not None:
        progress.start(kept)
    translated = 0
    texts = (decode_line(raw, lines.name, number) for number, raw in run.hashed(numbered))
    for _, translations in translated_windows(translator, texts, window, first + kept, split_sentences):
        run.append(translations)
        translated += len(translations)
        if progress is not None:
            progress.update(kept + translated)
    run.finish()
    if progress is not None:
        progress.finish(kept + translated)
    return Summary(translated, kept, time.perf_counter() - started)


def _write_stream(translator, numbered, name, window, first, progress, output, split_sentences):
    if progress is not None:
        progress.start(0)
    texts = (decode_line(raw, name, number) for number, raw in numbered)
    records = _Records(getattr(translator, "lines_per_record", 1))
    translated = 0
    # Text to sys.stdout (which a caller may have replaced), bytes to a device.
    target = sys.stdout if output in (None, "-") else None
    try:
        if target is None:
            target = open(output, "w", encoding="utf-8")
        for _, translations in translated_windows(translator, texts, window, first, split_sentences):
            target.write(records.text(translations))
            target.flush()
            translated += len(translations)
            if progress is not None:
                progress.update(translated)
    except OSError as error:
        raise CannotWrite("<stdout>" if output in (None, "-") else output, error) from None
    finally:
        if target is not None and target is not sys.stdout:
            with contextlib.suppress(OSError):
                target.close()
    if progress is not None:
        progress.finish(translated)
    return translated


def _numbered(file):
    for number, raw in enumerate(file, start=1):
        yield number, raw[:-1] if raw.endswith(b"\n") else raw


def _to_stderr(line):
    print(line, file=sys.stderr, flush=True)


def _hashed(raw):
    return raw + b"\n"


class _Records:
    """The text of a window's records: a translation never spans lines, so
    the output stays line-aligned; a record of several lines
    (`lines_per_record`) comes with its lines apart."""

    def __init__(self, lines_per_record):
        self.lines_per_record = lines_per_record

    def text(self, records):
        if self.lines_per_record == 1:
            return "".join(record.replace("\n", " ").replace("\r", " ") + "\n" for record in records)
        return "".join(record + "\n" for record in records)

    def whole(self, tail):
        """`(records, bytes)` of the whole records that `tail` begins with."""
        newlines = [i for i, byte in enumerate(tail) if byte == 0x0A]
        count = len(newlines) // self.lines_per_record
        return count, newlines[count * self.lines_per_record - 1] + 1 if count else 0


class _Run:
    """The partial output of one `translate_file` run and the record of it
    (`OUTPUT.partial.json`): the run's identity, the lines written, the
    bytes they take and the hash of the input lines they translate."""

    def __init__(self, output, lines_per_record, identity):
        self.records = _Records(lines_per_record)
        self.output = output
        self.partial = output + PARTIAL_SUFFIX
        self.state_path = output + STATE_SUFFIX
        self.identity = identity
        self.lines = 0
        self.bytes = 0
        self.hash = hashlib.sha256()
        self._file = None
        self._pending_hashes = None

    def open(self, numbered):
        """Opens the partial output, continuing an interrupted run's; skips
        the lines of `numbered` it holds. Returns how many it holds."""
        state = self._read_state()
        if state is not None and state.get("complete") and not os.path.exists(self.partial):
            state = None  # the last run finished but for removing its record
        if state is not None and os.path.exists(self.partial):
            self._continue(state, numbered)
        else:
            self._write_state()
            self._file = open(self.partial, "wb")
        return self.lines

    def _continue(self, state, numbered):
        if {key: state.get(key) for key in self.identity} != self.identity:
            changed = [key for key in self.identity if state.get(key) != self.identity[key]]
            raise ValueError(
                f"{self.partial} is an interrupted translation of another {' and '.join(changed)} "
                f"({', '.join(f'{key}: {state.get(key)!r}' for key in changed)}). "
                f"Remove {self.partial} to start over, or continue it with the same input and settings."
            )
        checked, recorded = state["lines"], state["bytes"]
        size = os.path.getsize(self.partial)
        if size < recorded:
            raise ValueError(
                f"{self.partial} has {size} bytes, fewer than the {recorded} its record "
                f"{self.state_path} says were written; remove both to start over."
            )
        # Lines written after the last record (a kill between a window's
        # write and its record) are complete lines too: kept, not redone.
        with open(self.partial, "rb") as file:
            file.seek(recorded)
            tail = file.read()
        records, complete = self.records.whole(tail)
        self.lines = checked + records
        self.bytes = recorded + complete
        for done in range(self.lines):
            item = next(numbered, None)
            if item is None:
                raise ValueError(
                    f"{self.partial} holds {self.lines} lines, more than the input has: {done}; "
                    "remove it to start over."
                )
            self.hash.update(_hashed(item[1]))
            if done + 1 == checked and self.hash.hexdigest() != state["input_sha256"]:
                raise ValueError(
                    f"The input's first {checked} lines differ from those translated in "
                    f"{self.partial}; remove it to start over."
                )
        self._file = open(self.partial, "r+b")
        self._file.truncate(self.bytes)
        self._file.seek(self.bytes)

    def hashed(self, numbered):
        """`numbered`'s `(number, raw line)`s, each added to the hash of the
        input as it is read: a window is read whole before it is written."""
        for item in numbered:
            self.hash.update(_hashed(item[1]))
            yield item

    def append(self, translations):
        """Writes a window's translations, then records them."""
        data = self.records.text(translations).encode("utf-8")
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.bytes += len(data)
        self.lines += len(translations)
        self._write_state()

    def finish(self):
        """Puts the finished output in place and removes the record."""
        self._file.close()
        self._write_state(complete=True)
        os.replace(self.partial, self.output)
        os.remove(self.state_path)

    def _read_state(self):
        if not os.path.exists(self.state_path):
            return None
        try:
            with open(self.state_path, "rb") as file:
                state = json.loads(file.read())
            assert isinstance(state, dict) and isinstance(state.get("lines"), int)
            assert isinstance(state.get("bytes"), int) and isinstance(state.get("input_sha256"), str)
        except (ValueError, AssertionError):
            raise ValueError(
                f"{self.state_path} is not the record of an interrupted translation; remove it "
                f"(and {self.partial}) to start over."
            ) from None
        return state

    def _write_state(self, complete=False):
        state = dict(self.identity, lines=self.lines, bytes=self.bytes, input_sha256=self.hash.hexdigest())
        if complete:
            state["complete"] = True
        write_atomically(self.state_path, json.dumps(state))


class Progress:
    """Lines done, lines a second and the time left, written to `stream`
    (stderr): in place on a terminal each `interval` seconds (1), else a
    line each `interval` (10)."""

    def __init__(self, stream=None, interval=None, done="translated", unit="lines"):
        self.stream = stream or sys.stderr
        self.done, self.unit = done, unit  # "scored", "pairs" for `score`
        self.terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = interval if interval is not None else (1.0 if self.terminal else 10.0)
        self.total = None
        self.first = 0
        self.started = self.shown = time.monotonic()

    def start(self, done):
        """The count starts at `done` lines (those kept from an earlier run)."""
        self.first = done
        self.started = self.shown = time.monotonic()

    def update(self, done, final=False):
        now = time.monotonic()
        if not final and now - self.shown < self.interval:
            return
        self.shown = now
        elapsed = now - self.started
        rate = (done - self.first) / elapsed if elapsed > 0 else 0.0
        text = f"{self.done} {done:,}"
        if self.total:
            text += f" of {self.total:,} {self.unit} ({100 * done / self.total:.1f}%)"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.1f} {self.unit}/s"
        if final:
            text += f", {_duration(elapsed)}"
        elif self.total and rate > 0:
            text += f", {_duration((self.total - done) / rate)} left"
        self.stream.write(("\r" + text + "\x1b[K" + ("\n" if final else "")) if self.terminal else text + "\n")
        self.stream.flush()

    def finish(self, done):
        self.update(done, final=True)


def _duration(seconds):
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"
