"""A training run in its own process, for the distribution tests.

    python tests/train_process.py MODEL_DIR STEPS CHECKPOINT_EVERY WEIGHTS.npz
        [--devices N] [--dropout P] [--accumulate N]

Trains the tiny model on the reversal task with `keras_transformer.training`
on a deterministic dataset, then writes the final weights and the per-step
losses.
`--devices N` replicates over N devices (TensorFlow logical CPU devices, or
JAX host devices when XLA_FLAGS asks for them). `--fixed-length` gives every
sequence the same length, so every replica holds as many tokens.
`--worker I --ports P0,P1` makes this process worker I of a
MultiWorkerMirroredStrategy cluster on 127.0.0.1.
"""

import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("model_dir")
parser.add_argument("steps", type=int)
parser.add_argument("checkpoint_every", type=int)
parser.add_argument("output")
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--fixed-length", action="store_true")
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--accumulate", type=int, default=1, help="batches per update")
parser.add_argument("--worker", type=int, help="this worker's index")
parser.add_argument("--ports", help="comma-separated 127.0.0.1 ports, one per worker")
args = parser.parse_args()

if args.worker is not None:
    # Several machines, simulated by processes on this one.
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in args.ports.split(",")]},
            "task": {"type": "worker", "index": args.worker},
        }
    )

devices = None
if args.devices > 1 and keras.backend.backend() == "tensorflow":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices
    )
    devices = [f"/cpu:{i}" for i in range(args.devices)]
elif args.devices > 1 and keras.backend.backend() == "jax":
    import jax

    devices = jax.devices()[: args.devices]

import keras_transformer as kt  # noqa: E402

keras.utils.set_random_seed(0)
distribution = kt.training.Distribution(devices)
min_length = 10 if args.fixed_length else 3
inputs, labels = kt.data.reversal_task(640, 16, min_length=min_length, seed=0)
dataset = (
    tf.data.Dataset.from_tensor_slices((inputs, labels))
    .repeat()
    .batch(32)
)
with distribution.scope():
    model = kt.build_transformer("tiny", vocabulary_size=16, dropout=args.dropout)
    kt.training.compile_model(model, warmup_steps=20, accumulate=args.accumulate)


class Record(keras.callbacks.Callback):
    losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


model = kt.training.fit(
    model,
    dataset,
    args.model_dir,
    args.steps,
    checkpoint_every=args.checkpoint_every,
    callbacks=[Record()],
    verbose=0,
)
np.savez(
    args.output,
    losses=np.array(Record.losses),
    step=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
    replicas=distribution.num_replicas,
    **{f"w{i}": w for i, w in enumerate(model.get_weights())},
)
