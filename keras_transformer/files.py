"""Every file the package writes goes through here: written under a
temporary name in its own folder, then renamed into place.

A rename within a folder is atomic, so a kill at any moment leaves the old
file or the new one, never a torn one; a failed write (a full disk) removes
its temporary file and names the file it could not write.
"""

import contextlib
import glob
import os
import tempfile

# The prefix of a temporary file: hidden, and never a name a reader takes.
PARTIAL_PREFIX = ".partial-"


class CannotWrite(OSError):
    """A write that failed, named by the file (or folder) it was for."""

    def __init__(self, path, error):
        super().__init__(f"Cannot write {path}: {error.strerror or error}")
        self.path = path


@contextlib.contextmanager
def atomic_path(path):
    """A temporary path beside `path` (same folder, same suffix, as Keras's
    `.keras` saving needs) to write to; renamed to `path` when the block
    ends without error, removed otherwise.

    Raises:
        CannotWrite: naming `path`, when the write or the rename fails.
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        # What a killed write of this file left behind.
        for stale in glob.glob(os.path.join(glob.escape(directory), glob.escape(PARTIAL_PREFIX + name) + ".*")):
            _remove(stale)
        handle, temporary = tempfile.mkstemp(
            prefix=PARTIAL_PREFIX + name + ".", suffix=os.path.splitext(name)[1], dir=directory
        )
        os.close(handle)
    except OSError as error:
        raise CannotWrite(path, error) from None
    try:
        yield temporary
        _sync(temporary)
        os.replace(temporary, path)
    except CannotWrite:
        _remove(temporary)
        raise
    except OSError as error:
        _remove(temporary)
        raise CannotWrite(path, error) from None
    except BaseException:
        _remove(temporary)
        raise


def write_atomically(path, content):
    """Writes `content` (str or bytes) to `path` through a temporary file
    beside it."""
    binary = isinstance(content, (bytes, bytearray, memoryview))
    with atomic_path(path) as temporary:
        with open(temporary, "wb" if binary else "w", encoding=None if binary else "utf-8") as file:
            file.write(content)


def _sync(path):
    with open(path, "rb+") as file:
        os.fsync(file.fileno())


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def check_writable(path):
    """Fails before any work if `path` cannot be written."""
    if path in (None, "-"):
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--output {path} is a directory; expected a file path.")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"--output {path}: the directory {directory} does not exist.")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"--output {path} is not writable.")
