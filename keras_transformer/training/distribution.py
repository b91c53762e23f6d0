"""Data parallelism with each backend's own engine. The one module of the
training code that knows the backend.

- TensorFlow: `tf.distribute.MultiWorkerMirroredStrategy` when `TF_CONFIG`
  names several workers, else `MirroredStrategy` over the given devices or
  every local GPU, else the default (single-device) strategy.
- JAX: `keras.distribution.DataParallel` over every device;
  `keras.distribution.initialize()` (which calls `jax.distributed.initialize`)
  first when `JAX_COORDINATOR_ADDRESS` is set, with `JAX_NUM_PROCESSES` and
  `JAX_PROCESS_ID` where no cluster manager (SLURM, Open MPI, Kubernetes,
  Cloud TPU) tells JAX. One process per machine; each feeds its own rows of
  every global batch (`data_shard`).
- torch: one device. Keras has no multi-device data parallelism for torch.
"""

import contextlib
import json
import os

import keras


class Distribution:
    """Where a model is built and trained, and over how many replicas.

    Build and compile the model inside `scope()`. The global batch is what
    the dataset yields; each replica gets `1 / num_replicas` of it.

    Attributes:
        num_replicas: the devices the global batch is split over, in all
            processes together.
        data_shard: `(index, count)`: this process feeds rows
            `index / count` of each global batch, as `TokenBatches(shard=)`
            gives them. `(0, 1)` but for JAX over several processes;
            TensorFlow's strategies split the batch each worker feeds.

    Args:
        devices: TensorFlow or JAX device names to replicate over (such as
            `["/cpu:0", "/cpu:1"]` or JAX's devices); every accelerator when
            None.
        heartbeat_timeout: seconds after which a silent process is lost,
            for a run of several: `jax.distributed`'s heartbeat timeout (100
            by default); under TensorFlow, the collectives' timeout
            (`CommunicationOptions`; its coordination service's heartbeats
            are not public, and declare a worker lost after about 10 s).
            None for the engine's default.
    """

    def __init__(self, devices=None, heartbeat_timeout=None):
        if heartbeat_timeout is not None and (
                isinstance(heartbeat_timeout, bool) or not isinstance(heartbeat_timeout, int) or heartbeat_timeout < 1):
            raise ValueError(f"heartbeat_timeout must be whole seconds >= 1. Received: {heartbeat_timeout!r}")
        self.backend = keras.backend.backend()
        self._strategy = None
        self.data_shard = (0, 1)
        if self.backend == "tensorflow":
            self._strategy = _tensorflow_strategy(devices, heartbeat_timeout)
            self.num_replicas = self._strategy.num_replicas_in_sync
        elif self.backend == "jax":
            import jax

            if (
                os.environ.get("JAX_COORDINATOR_ADDRESS")
                and not jax.distributed.is_initialized()
            ):
                where = (os.environ["JAX_COORDINATOR_ADDRESS"], _int_or_none(os.environ.get("JAX_NUM_PROCESSES")),
                         _int_or_none(os.environ.get("JAX_PROCESS_ID")))
                if heartbeat_timeout is None:
                    # Keras's initialize also agrees on one seed when none is set.
                    keras.distribution.initialize(*where)
                else:  # which Keras's does not pass on (the run sets its seed)
                    jax.distributed.initialize(*where, heartbeat_timeout_seconds=heartbeat_timeout)
            devices = devices if devices is not None else jax.devices()
            self.num_replicas = len(devices)
            self.data_shard = (jax.process_index(), jax.process_count())
            if self.num_replicas > 1:
                # Each process feeds its own shard, which Keras could only
                # cut from a tf.data.Dataset itself.
                keras.distribution.set_distribution(
                    keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
                )
        else:
            if devices is not None and len(devices) > 1:
                raise ValueError(
                    f"The {self.backend} backend trains on one device; Keras "
                    "offers no data parallelism for it. Use "
                    "KERAS_BACKEND=tensorflow or jax for several devices. "
                    f"Received: devices={devices}"
                )
            self.num_replicas = 1

    @property
    def processes(self):
        """How many processes train together: JAX processes or TensorFlow workers."""
        if self.backend == "tensorflow":
            return max(1, tensorflow_workers())
        return self.data_shard[1]

    @property
    def process_index(self):
        """This process's number in the run: JAX's process index, or the
        TensorFlow worker's task index."""
        if self.backend == "tensorflow" and tensorflow_workers() > 1:
            return int(json.loads(os.environ["TF_CONFIG"]).get("task", {}).get("index", 0))
        return self.data_shard[0]

    def barrier(self):
        """Returns when every process of the run has called it."""
        self.least(0)

    def least(self, value):
        """The least of every process's integer `value`; each process calls
        it, as a collective (the newest checkpoint step they all have)."""
        if self.processes == 1:
            return value
        if self.backend == "jax":
            import numpy as np
            from jax.experimental import multihost_utils

            return int(np.min(multihost_utils.process_allgather(np.array([value], "int64"))))
        import tensorflow as tf

        strategy = self._strategy
        values = strategy.run(lambda: tf.constant([value], tf.int64))
        return int(tf.reduce_min(strategy.gather(values, axis=0)).numpy())

    def scope(self):
        """The context in which to build and compile the model."""
        if self._strategy is not None:
            return self._strategy.scope()
        return contextlib.nullcontext()

    def __repr__(self):
        kind = type(self._strategy).__name__ if self._strategy else "DataParallel"
        if self.num_replicas == 1 and self._strategy is None:
            kind = "single device"
        processes = f", processes={self.data_shard[1]}" if self.data_shard[1] > 1 else ""
        return f"Distribution({self.backend}, {kind}, replicas={self.num_replicas}{processes})"


def training_devices():
    """How many devices a `Distribution()` trains on here, before one is
    made: every accelerator (JAX's devices of all its processes;
    TensorFlow's GPUs, or 1; torch's 1)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.device_count()
    if backend == "tensorflow":
        import tensorflow as tf

        return max(1, len(tf.config.list_logical_devices("GPU"))) * max(1, tensorflow_workers())
    return 1


@contextlib.contextmanager
def local_reads():
    """Keras's distribution unset while inside, so that a checkpoint read
    there is this process's alone: loaded under a distribution across
    processes, a model gathers its variables from all of them, and
    processes reading different files block or fail."""
    current = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(current)


def _int_or_none(value):
    return None if value in (None, "") else int(value)


def tensorflow_workers():
    """How many workers `TF_CONFIG`'s cluster names (0 without one)."""
    return len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("worker", []))


def _tensorflow_strategy(devices, heartbeat_timeout=None):
    import tensorflow as tf

    if tensorflow_workers() > 1:

        class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
            """Works around two Keras 3.15 calls that the collective
            `reduce` refuses: the first batch, a dict of
            {"source_ids", "target_ids"}, reduced to learn its structure;
            and scalar losses and metrics reduced along axis 0."""

            def reduce(self, reduce_op, value, axis):
                if isinstance(value, dict):
                    return {k: self.reduce(reduce_op, v, axis) for k, v in value.items()}
                if isinstance(value, (list, tuple)):
                    return type(value)(self.reduce(reduce_op, v, axis) for v in value)
                if axis is not None and self.experimental_local_results(value)[0].shape.rank == 0:
                    axis = None  # a scalar per replica: reduce across replicas
                return super().reduce(reduce_op, value, axis)

        return MultiWorkerMirroredStrategy(communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=None if heartbeat_timeout is None else float(heartbeat_timeout)))
    if devices is not None:
        return tf.distribute.MirroredStrategy(devices)
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
    return tf.distribute.get_strategy()
