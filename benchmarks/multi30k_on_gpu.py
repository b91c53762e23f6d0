"""The Multi30k recipe's training, run on a GPU machine that has Keras and JAX
but no TensorFlow (the `device` machine this project is sometimes lent).

    python benchmarks/multi30k_on_gpu.py prepare [--bundle .gpu] [--direction en-de]
    # there:  KERAS_BACKEND=jax python3 benchmarks/multi30k_on_gpu.py train --bundle .gpu --out DIR
    python benchmarks/multi30k_on_gpu.py finish --from DIR [--bundle .gpu]

On a machine with the package installed, `python recipes/multi30k_en_de.py`
is the command; this script exists because the lent machine has no
TensorFlow, which the package's input pipeline and search need, and cannot
install it (no network, and TensorFlow is too large to carry). So:

- `prepare` (here) takes the recipe's configuration, trains its vocabulary
  into its model directory (`runs/multi30k_<direction>_gpu`), and draws
  batches from the recipe's own `make_dataset` stream (token-bucketed,
  4,096 tokens, shuffled), stored as int16 arrays in the bundle;
- `train` (there) builds the same model with `build_transformer`, compiles
  it with `compile_model` (the paper's schedule and label smoothing) and
  trains it with `model.fit` for the recipe's steps, the stored batches
  reshuffled on each pass, with a checkpoint and the validation loss every
  `checkpoint_every` steps; it writes the last checkpoint and the average of
  the last `average` ones, without optimizer state, in pieces under the
  size limit of what comes back;
- `finish` (here) puts them into the model directory as a translator, and
  scores test2016 with the recipe's own `evaluate_test`, greedy and beam 4.
"""

import argparse
import glob
import importlib.util
import json
import os
import sys
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "multi30k_en_de.py")
PIECE_BYTES = 15 * 2**20  # files that come back are at most 16 MiB each
BATCH_FILE = "batches.npz"
CONFIG_FILE = "config.json"


def load_recipe():
    spec = importlib.util.spec_from_file_location("multi30k_recipe", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


def recipe_config(args):
    recipe = load_recipe()
    recipe_args = recipe.parse_args(["--direction", args.direction, "--data-dir", args.data_dir])
    config = recipe.configuration(recipe_args)
    config.model_dir = config.model_dir + "_gpu"
    return recipe, config


def prepare(args):
    import numpy as np

    from keras_transformer.data import make_dataset
    from keras_transformer.training.run import _vocabulary
    from keras_transformer.training.run import prepare_model_dir
    from keras_transformer.training.run import read_corpus

    _, config = recipe_config(args)
    config.validate()
    prepare_model_dir(config, resume=os.path.isdir(config.model_dir))
    train = read_corpus(config.train_source, config.train_target, "train")
    valid = read_corpus(config.valid_source, config.valid_target, "valid")
    tokenizer = _vocabulary(config, train, print)
    stream = make_dataset(
        train, tokenizer, config.tokens_per_batch, max_length=config.max_tokens,
        repeat=True, seed=config.seed,
    )
    valid_batches = make_dataset(
        valid, tokenizer, config.tokens_per_batch, max_length=config.max_tokens, shuffle=False
    )
    arrays = {}
    for name, batches in (("train", stream.take(args.batches)), ("valid", valid_batches)):
        count = 0
        for count, (inputs, labels) in enumerate(batches.as_numpy_iterator(), 1):
            for key, value in (("s", inputs["source_ids"]), ("t", inputs["target_ids"]), ("l", labels)):
                arrays[f"{name}_{key}{count - 1}"] = value.astype(np.int16)
        print(f"{name}: {count} batches")
    os.makedirs(args.bundle, exist_ok=True)
    np.savez_compressed(os.path.join(args.bundle, BATCH_FILE), **arrays)
    settings = {
        "model_dir": config.model_dir,
        "preset": config.preset,
        "architecture": config.architecture() | {"vocabulary_size": tokenizer.vocabulary_size},
        "dtype": config.dtype,
        "warmup_steps": config.warmup_steps,
        "label_smoothing": config.label_smoothing,
        "train_steps": config.train_steps,
        "checkpoint_every": config.checkpoint_every,
        "average": config.average,
        "seed": config.seed,
    }
    with open(os.path.join(args.bundle, CONFIG_FILE), "w") as file:
        json.dump(settings, file, indent=2)
    size = os.path.getsize(os.path.join(args.bundle, BATCH_FILE)) / 2**20
    print(f"wrote {args.bundle}/{BATCH_FILE} ({size:.1f} MiB) and {CONFIG_FILE}")


def read_settings(bundle):
    with open(os.path.join(bundle, CONFIG_FILE)) as file:
        return json.load(file)


def build_model(settings):
    """The recipe's model, uncompiled, as `prepare` recorded it."""
    from keras_transformer.models import build_transformer

    return build_transformer(
        settings["preset"], **settings["architecture"],
        dtype=None if settings["dtype"] == "float32" else settings["dtype"],
    )


def import_without_tensorflow():
    """Makes `keras_transformer.models` and `keras_transformer.training.*`
    importable without running the package's `__init__`, which imports the
    TensorFlow input pipeline. The modules used here need only Keras."""
    for name in ("keras_transformer", "keras_transformer.training"):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(REPO, *name.split("."))]
        sys.modules[name] = module


def train(args):
    import keras
    import numpy as np

    import_without_tensorflow()
    from keras_transformer.training.checkpoints import SaveCheckpoints
    from keras_transformer.training.checkpoints import average_checkpoints
    from keras_transformer.training.checkpoints import list_checkpoints
    from keras_transformer.training.trainer import compile_model

    settings = read_settings(args.bundle)
    stored = np.load(os.path.join(args.bundle, BATCH_FILE))

    def batches(name):
        count = sum(1 for key in stored.files if key.startswith(f"{name}_s"))
        return [
            (
                {"source_ids": stored[f"{name}_s{i}"].astype("int32"),
                 "target_ids": stored[f"{name}_t{i}"].astype("int32")},
                stored[f"{name}_l{i}"].astype("int32"),
            )
            for i in range(count)
        ]

    train_batches = coarsen(batches("train"))
    valid_batches = coarsen(batches("valid"))
    print(f"backend {keras.backend.backend()}, devices {describe_devices()}")
    print(f"{len(train_batches)} training batches, {len(valid_batches)} validation batches")

    def endless(seed):
        rng = np.random.default_rng(seed)
        while True:
            for index in rng.permutation(len(train_batches)):
                yield train_batches[index]

    class Validation(keras.utils.PyDataset):
        def __len__(self):
            return len(valid_batches)

        def __getitem__(self, index):
            return valid_batches[index]

    class History(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.rows, self.seconds = [], 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.time()

        def on_test_begin(self, logs=None):
            self.seconds += time.time() - self.start  # training time, validation left out

        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % 100 == 0:
                print(f"epoch {len(self.rows) + 1}, batch {batch + 1}, {time.time() - started:.0f}s", flush=True)
            if time.time() - started > args.deadline:
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            row = {"step": step, "train_seconds": round(self.seconds, 1)}
            row |= {key: float(value) for key, value in (logs or {}).items()}
            self.rows.append(row)
            print(json.dumps(row), flush=True)

    keras.utils.set_random_seed(settings["seed"])
    model = build_model(settings)
    compile_model(model, warmup_steps=settings["warmup_steps"], label_smoothing=settings["label_smoothing"])
    work = os.path.join("/tmp", "multi30k_gpu")
    checkpoint_dir = os.path.join(work, "checkpoints")
    history = History()
    started = time.time()
    model.fit(
        endless(settings["seed"]),
        steps_per_epoch=settings["checkpoint_every"],
        epochs=settings["train_steps"] // settings["checkpoint_every"],
        validation_data=Validation(),
        callbacks=[SaveCheckpoints(checkpoint_dir, keep=settings["average"]), history],
        verbose=2,
    )
    wall = time.time() - started
    kept = list_checkpoints(checkpoint_dir)[-settings["average"]:]
    os.makedirs(args.out, exist_ok=True)
    # Training ends on a checkpoint, so `model` holds the last one's weights.
    for name, model_out in (("last", model), ("average", average_checkpoints(kept))):
        path = os.path.join(work, f"{name}.weights.h5")  # without the optimizer's state
        bare = build_model(settings)  # no optimizer, whose state would triple the size
        bare.set_weights(model_out.get_weights())
        bare.save_weights(path)
        split_file(path, os.path.join(args.out, name))
    summary = {
        "devices": describe_devices(),
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "train_batches_stored": len(train_batches),
        "wall_seconds": round(wall, 1),
        "averaged": [os.path.basename(path) for path in kept],
        "history": history.rows,
    }
    with open(os.path.join(args.out, "gpu_run.json"), "w") as file:
        json.dump(summary, file, indent=2)
    print(f"trained {history.rows[-1]['step']} steps in {wall:.0f}s")


def coarsen(batches, lengths=(12, 16, 22, 30, 40, 56, 80, 128)):
    """Pads batches to a few shapes: each length up to the next of
    `lengths`, and the rows up to the most rows among the batches that go to
    that length. Rows of padding are ignored by the loss and the metrics.
    Every shape is one program for XLA to compile, which costs tens of
    seconds each on the GPU; 25 bucket shapes took most of 10 minutes."""
    import numpy as np

    def target_length(length):
        return next(l for l in lengths if l >= length)

    rows = {}
    for inputs, _ in batches:
        length = target_length(inputs["source_ids"].shape[1])
        rows[length] = max(rows.get(length, 0), inputs["source_ids"].shape[0])
    padded = []
    for inputs, labels in batches:
        length = target_length(inputs["source_ids"].shape[1])

        def pad(array):
            return np.pad(array, ((0, rows[length] - array.shape[0]), (0, length - array.shape[1])))

        padded.append(({key: pad(value) for key, value in inputs.items()}, pad(labels)))
    return padded


def describe_devices():
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return [str(device.device_kind) for device in jax.devices()]
    if keras.backend.backend() == "torch":
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or ["cpu"]
    return ["unknown"]


def split_file(path, prefix):
    with open(path, "rb") as source:
        index = 0
        while piece := source.read(PIECE_BYTES):
            with open(f"{prefix}.part{index}", "wb") as target:
                target.write(piece)
            index += 1


def join_pieces(prefix, path):
    pieces = sorted(glob.glob(f"{prefix}.part*"), key=lambda p: int(p.rsplit("part", 1)[1]))
    if not pieces:
        raise FileNotFoundError(f"No {prefix}.part* pieces. Expected the output of `train`.")
    with open(path, "wb") as target:
        for piece in pieces:
            with open(piece, "rb") as source:
                target.write(source.read())


def finish(args):
    from keras_transformer.data import SubwordTokenizer
    from keras_transformer.data import read_parallel_text
    from keras_transformer.decoding import Translator

    recipe, config = recipe_config(args)
    with open(os.path.join(args.source, "gpu_run.json")) as file:
        summary = json.load(file)
    settings = read_settings(args.bundle)

    def trained_model(name):
        model = build_model(settings)
        path = os.path.join(config.model_dir, f"{name}.weights.h5")
        join_pieces(os.path.join(args.source, name), path)
        model.load_weights(path)
        os.remove(path)
        return model

    checkpoint_dir = os.path.join(config.model_dir, "checkpoints")
    os.makedirs(checkpoint_dir, exist_ok=True)
    last_step = summary["history"][-1]["step"]
    trained_model("last").save(os.path.join(checkpoint_dir, f"ckpt-{last_step:08d}.keras"))
    translator = Translator(
        trained_model("average"), SubwordTokenizer.load(config.model_dir),
        beam_size=config.beam_size, alpha=config.alpha,
        max_extra_length=config.max_extra_length, max_source_length=config.max_tokens,
    )
    translator.save(config.model_dir)
    source, target = config.train_source[0][-2:], config.train_target[0][-2:]
    test = read_parallel_text(
        os.path.join(args.data_dir, f"test2016.{source}"), os.path.join(args.data_dir, f"test2016.{target}")
    )
    scores = recipe.evaluate_test(config, test.sources, test.targets, print)
    summary["test2016"] = scores
    with open(os.path.join(config.model_dir, "gpu_results.json"), "w") as file:
        json.dump(summary, file, indent=2)
    print(f"wrote {config.model_dir}/gpu_results.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["prepare", "train", "finish"])
    parser.add_argument("--bundle", default=".gpu", help="where `prepare` writes and `train` reads")
    parser.add_argument("--direction", default="en-de", choices=["en-de", "de-en"])
    parser.add_argument("--data-dir", default=os.path.join(REPO, "..", "shared", "data", "multi30k"))
    parser.add_argument("--batches", type=int, default=3000, help="training batches to store")
    parser.add_argument("--out", help="train: where the trained models go")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="train: stop after this many seconds")
    parser.add_argument("--from", dest="source", help="finish: the folder `train` wrote")
    args = parser.parse_args()
    {"prepare": prepare, "train": train, "finish": finish}[args.stage](args)


if __name__ == "__main__":
    main()
