"""A training run that writes down every batch it is served, for the
resume test of `TokenBatches`.

    python tests/resume_batches_process.py MODEL_DIR STEPS CHECKPOINT_EVERY LOG WEIGHTS.npz

Trains the tiny model with `keras_transformer.training.fit` on seeded,
endless `TokenBatches` of the built-in corpus. Each batch served is one
line of LOG: the run's step it belongs to and a hash of its ids.
"""

import hashlib
import sys

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer.data import TokenBatches
from keras_transformer.data.prepared import tokenize_pairs

model_dir, steps, checkpoint_every, log_path, weights_path = sys.argv[1:]


class LoggedBatches(TokenBatches):
    def __getitem__(self, index):
        batch = super().__getitem__(index)
        digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in (*batch[0].values(), batch[1])))
        with open(log_path, "a") as log:
            log.write(f"{self._start + index} {digest.hexdigest()[:16]}\n")
        return batch


keras.utils.set_random_seed(0)
corpus = kt.data.builtin_corpus("train", size=400, seed=3)
tokenizer = kt.data.SubwordTokenizer.train(corpus, vocabulary_size=400)
sources, targets = zip(*corpus)
# Three bucket lengths (8, 32, 64): few shapes for XLA to compile.
batches = LoggedBatches(
    tokenize_pairs(sources, targets, tokenizer), 256, max_length=64, repeat=True, seed=7, bucket_step=4.0
)
model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, num_layers=1, dropout=0.1)
kt.training.compile_model(model, warmup_steps=10)
model = kt.training.fit(model, batches, model_dir, int(steps), checkpoint_every=int(checkpoint_every), verbose=0)
np.savez(weights_path, *model.get_weights())
