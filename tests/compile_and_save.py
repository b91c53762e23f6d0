"""Compiles the tiny model one way under this process's backend, fits two
steps and saves it as `<backend>-<setting>.keras`, for
tests/test_compile_settings.py: setting `auto` (`jit_compile` at its
default) or `jit` (`jit_compile=True`).

    KERAS_BACKEND=jax python tests/compile_and_save.py DIRECTORY jit
"""

import json
import os
import sys

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer import training

SETTINGS = {"auto": "auto", "jit": True}
# Wide enough logits that torch's oneDNN product pays (backend/products.py),
# which torch.compile's Inductor cannot lower.
VOCABULARY = 1000


def batch(seed):
    """Two steps' batches of the tiny model's ids: (inputs, labels)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCABULARY, size=(3, 8, 9)).astype("int32")
    return {"source_ids": ids[0], "target_ids": ids[1]}, ids[2]


def layers_model(jit_compile):
    """The package's layers that hold an eager fast path, as one small
    Functional model trained by the paper's Adam: the id check, the shared
    embedding and its logits (oneDNN's product at this width), the
    host-seeded dropout and the feed-forward's products."""
    from keras_transformer import checks

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32")
    embedding = kt.layers.TokenEmbedding(VOCABULARY, 32)
    states = kt.layers.Dropout(0.1, seed=1)(embedding(checks.TokenIdCheck(VOCABULARY)(ids)))
    model = keras.Model(ids, embedding(kt.layers.PositionwiseFeedForward(64)(states), reverse=True))
    model.compile(optimizer=kt.optimizers.transformer_adam(d_model=32, warmup_steps=10),
                  loss=kt.losses.LabelSmoothedCrossEntropy(), jit_compile=jit_compile)
    return model


def save_compiled(directory, setting):
    keras.utils.set_random_seed(0)
    model = kt.build_transformer("tiny", vocabulary_size=VOCABULARY, num_layers=1, d_model=32, d_ff=64, num_heads=2)
    training.compile_model(model, warmup_steps=10, jit_compile=SETTINGS[setting])
    history = model.fit(*batch(0), batch_size=4, epochs=1, verbose=0)
    name = f"{keras.backend.backend()}-{setting}"
    model.save(os.path.join(directory, f"{name}.keras"))
    with open(os.path.join(directory, f"{name}.json"), "w") as file:
        json.dump({"jit_compile": model.jit_compile, "losses": history.history["loss"]}, file)


if __name__ == "__main__":
    save_compiled(*sys.argv[1:])
