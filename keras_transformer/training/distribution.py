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
    """

    def __init__(self, devices=None):
        self.backend = keras.backend.backend()
        self._strategy = None
        self.data_shard = (0, 1)
        if self.backend == "tensorflow":
            self._strategy = _tensorflow_strategy(devices)
            self.num_replicas = self._strategy.num_replicas_in_sync
        elif self.backend == "jax":
            import jax

            if (
                os.environ.get("JAX_COORDINATOR_ADDRESS")
                and not jax.distributed.is_initialized()
            ):
                # Keras's initialize also agrees on one seed when none is set.
                keras.distribution.initialize(
                    os.environ["JAX_COORDINATOR_ADDRESS"],
                    _int_or_none(os.environ.get("JAX_NUM_PROCESSES")),
                    _int_or_none(os.environ.get("JAX_PROCESS_ID")),
                )
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


def _int_or_none(value):
    return None if value in (None, "") else int(value)


def _tensorflow_strategy(devices):
    import tensorflow as tf

    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    if len(cluster.get("worker", [])) > 1:

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

        return MultiWorkerMirroredStrategy()
    if devices is not None:
        return tf.distribute.MirroredStrategy(devices)
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
    return tf.distribute.get_strategy()
