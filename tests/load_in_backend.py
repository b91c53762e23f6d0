"""Loads a `.keras` file and writes its logits, under $KERAS_BACKEND.

Run by test_serialization.py in a fresh process, so that the backend that
loads differs from the one that saved.
"""

import sys

import keras
import numpy as np

import keras_transformer  # noqa: F401  (registers the classes)

model_path, inputs_path, output_path = sys.argv[1:]
model = keras.saving.load_model(model_path)
inputs = dict(np.load(inputs_path))
np.save(output_path, keras.ops.convert_to_numpy(model(inputs)))
print(keras.backend.backend(), type(model).__name__, model.count_params())
