"""TensorBoard event files on every backend, without TensorFlow.

A run's scalars and texts are written with `tensorboard`'s own record
writer and protocol buffers, which need neither TensorFlow nor torch: a
training process under JAX or torch imports neither for its logs (Keras's
`TensorBoard` callback writes through TensorFlow, 2 to 5 s of CPU to
import in each process). `tensorboard DIR` reads what it writes.
"""

import os
import socket
import threading
import time

import keras

# tensorboard's event format: each file begins with this version record.
FILE_VERSION = "brain.Event:2"


class Board:
    """One event file of a run in `directory`: scalars and markdown texts.

    A run resumed at step S writes a session start at step S + 1 first,
    so that TensorBoard drops what earlier files hold for the steps after
    S, which the resumed run trains again.

    Thread-safe: the progress log writes from Keras's step-hook threads.

    Args:
        directory: where the event file goes (created if missing).
        resumed_at: the step the run continues from, 0 for a new run.
    """

    def __init__(self, directory, resumed_at=0):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._events = event_pb2
        os.makedirs(directory, exist_ok=True)
        # tensorboard's naming: it reads `*tfevents*` files in name order.
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(directory, name)
        self._file = open(self.path, "wb")
        self._records = RecordWriter(self._file)
        self._guard = threading.Lock()
        self._write(self._events.Event(file_version=FILE_VERSION))
        if resumed_at:
            start = self._events.SessionLog(status=self._events.SessionLog.START)
            self._write(self._events.Event(step=resumed_at + 1, session_log=start))
        self.flush()

    def scalars(self, step, values):
        """Writes each `{tag: number}` at `step` (non-numbers are skipped)."""
        from tensorboard.compat.proto import summary_pb2

        entries = [
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        if entries:
            self._write(self._events.Event(step=step, summary=summary_pb2.Summary(value=entries)))

    def text(self, step, tag, markdown):
        """Writes a markdown text (TensorBoard's text tab) at `step`."""
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.compat.proto import tensor_pb2
        from tensorboard.compat.proto import types_pb2
        from tensorboard.plugins.text import metadata

        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[markdown.encode()])
        entry = summary_pb2.Summary.Value(
            tag=tag, metadata=metadata.create_summary_metadata(tag, ""), tensor=tensor
        )
        self._write(self._events.Event(step=step, summary=summary_pb2.Summary(value=[entry])))

    def flush(self):
        with self._guard:
            if not self._file.closed:
                self._records.flush()

    def close(self):
        with self._guard:
            if not self._file.closed:
                self._records.flush()
                self._file.close()

    def _write(self, event):
        event.wall_time = event.wall_time or time.time()
        with self._guard:
            if not self._file.closed:
                self._records.write(event.SerializeToString())


def translations_table(sources, hypotheses, references):
    """A markdown table of translations, for `Board.text`."""

    def cell(text):
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| source | translation | reference |", "| --- | --- | --- |"]
    rows += [f"| {cell(s)} | {cell(h)} | {cell(r)} |" for s, h, r in zip(sources, hypotheses, references)]
    return "\n".join(rows)


class WriteBoard(keras.callbacks.Callback):
    """Each checkpoint interval's logs (an epoch of `fit`) on a `Board`:
    `valid/<metric>` for the validation's, `train/interval_<metric>` for
    the interval's means of the training metrics. Flushes the file, so
    that what a checkpoint holds is on the board too."""

    def __init__(self, board):
        super().__init__()
        self.board = board

    def on_epoch_end(self, epoch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        values = {}
        for key, value in (logs or {}).items():
            if key.endswith("target_tokens"):  # bookkeeping (tokens/s is the progress log's)
                continue
            if key == "gradient_norm":  # the last update's, not the interval's: the progress log writes it
                continue
            tag = f"valid/{key[4:]}" if key.startswith("val_") else f"train/interval_{key}"
            values[tag] = float(value) if hasattr(value, "__float__") else value
        self.board.scalars(step, values)
        self.board.flush()

    def on_train_end(self, logs=None):
        self.board.flush()
