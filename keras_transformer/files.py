"""Every file the package writes goes through here: written under a
temporary name in its own folder, then renamed into place.

A rename within a folder is atomic, so a kill at any moment leaves the old
file or the new one, never a torn one; a failed write (a full disk) removes
its temporary file and names the file it could not write.
"""

import contextlib
import errno
import glob
import math
import os
import shutil
import tempfile
import zipfile

try:
    import resource  # the file-size limit, where the system has one
except ImportError:
    resource = None

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
            remove(stale)
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
        remove(temporary)
        raise
    except OSError as error:
        remove(temporary)
        raise CannotWrite(path, error) from None
    except BaseException:
        remove(temporary)
        raise


def write_atomically(path, content):
    """Writes `content` (str or bytes) to `path` through a temporary file
    beside it."""
    binary = isinstance(content, (bytes, bytearray, memoryview))
    with atomic_path(path) as temporary:
        with open(temporary, "wb" if binary else "w", encoding=None if binary else "utf-8") as file:
            file.write(content)


def save_keras_model(model, path):
    """Writes `model` to the `.keras` file `path`, through a temporary file
    as every file here, with its weights written to disk first.

    Keras writes the weights of a model under half the machine's memory
    into memory, and then into the archive: a second copy of the model at
    once, which a converted model's peak memory would be. Saved unzipped in
    a folder beside the file, then archived file by file, the `.keras` file
    holds the same files, stored uncompressed, as Keras's own.
    """
    with atomic_path(path) as temporary:
        # The weights' file, then the archive of it, side by side.
        _check_room(os.path.dirname(temporary), _weights_file_size(model), files=2)
        # Named after the temporary file, so that the next write clears it
        # where a kill left it.
        unzipped = tempfile.mkdtemp(prefix=os.path.basename(temporary) + ".", dir=os.path.dirname(temporary))
        try:
            folder = os.path.join(unzipped, "model")
            model.save(folder, zipped=False)
            with zipfile.ZipFile(temporary, "w") as archive:
                for parent, _, names in os.walk(folder):
                    for name in sorted(names):
                        archive.write(os.path.join(parent, name), os.path.relpath(os.path.join(parent, name), folder))
        finally:
            remove(unzipped)


def _weights_file_size(model):
    """About the bytes of the HDF5 file of `model`'s weights (its
    optimizer's too): the numbers, and room for each dataset's header."""
    import keras
    import numpy as np

    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None:
        variables += list(model.optimizer.variables)
    numbers = sum(math.prod(v.shape) * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize for v in variables)
    return numbers + 4096 * len(variables) + 2**20


def _check_room(folder, size, files):
    """Fails, as the write would, where `files` files of `size` bytes do not
    fit on the disk or under the process's file-size limit: HDF5 ends the
    process, not just the write, when a write of its file fails."""
    if shutil.disk_usage(folder).free < size * files:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if resource is not None:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and size > limit:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))


def _sync(path):
    with open(path, "rb+") as file:
        os.fsync(file.fileno())


def remove(path):
    """Removes the file or folder `path`, if it is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
        return
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


def cache_directory(*parts):
    """`$XDG_CACHE_HOME/keras-transformer/<parts>` (`~/.cache/...` where
    it is unset): where the package keeps what it can make again."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser(os.path.join("~", ".cache"))
    return os.path.join(root, "keras-transformer", *parts)
