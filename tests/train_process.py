"""A training run in its own process, for the distribution tests.

    python tests/train_process.py MODEL_DIR STEPS CHECKPOINT_EVERY WEIGHTS.npz
        [--devices N] [--fixed-length] [--dropout P] [--accumulate N]

Trains the tiny model on the reversal task with `keras_transformer.training`
on a deterministic dataset, then writes the final weights and the per-step
losses.
`--devices N` replicates over N devices (TensorFlow logical CPU devices, or
JAX host devices when XLA_FLAGS asks for them). `--fixed-length` gives every
sequence the same length, so every replica holds as many tokens.

`train(...)` is the same run on one device in the calling process: the
tests' single-device references, which need no process of their own.
"""

import argparse

import keras
import numpy as np
import tensorflow as tf


def train(model_dir, steps, checkpoint_every, devices=None, fixed_length=False, dropout=0.0, accumulate=1):
    """The run; returns what the command writes to WEIGHTS.npz, as a dict."""
    import keras_transformer as kt  # after the command has set up its devices

    keras.utils.set_random_seed(0)
    distribution = kt.training.Distribution(devices)
    min_length = 10 if fixed_length else 3
    inputs, labels = kt.data.reversal_task(640, 16, min_length=min_length, seed=0)
    dataset = (
        tf.data.Dataset.from_tensor_slices((inputs, labels))
        .repeat()
        .batch(32)
    )
    with distribution.scope():
        model = kt.build_transformer("tiny", vocabulary_size=16, dropout=dropout)
        kt.training.compile_model(model, warmup_steps=20, accumulate=accumulate)

    losses = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))

    model = kt.training.fit(
        model,
        dataset,
        model_dir,
        steps,
        checkpoint_every=checkpoint_every,
        callbacks=[Record()],
        verbose=0,
    )
    return dict(
        losses=np.array(losses),
        step=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        replicas=distribution.num_replicas,
        **{f"w{i}": w for i, w in enumerate(model.get_weights())},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("checkpoint_every", type=int)
    parser.add_argument("output")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--fixed-length", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--accumulate", type=int, default=1, help="batches per update")
    args = parser.parse_args()

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

    result = train(args.model_dir, args.steps, args.checkpoint_every, devices, args.fixed_length, args.dropout,
                   args.accumulate)
    np.savez(args.output, **result)
