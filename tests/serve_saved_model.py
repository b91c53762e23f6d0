"""Serves an exported SavedModel with TensorFlow and tensorflow-text only.

Run by test_export.py in a fresh process, as a TF Serving host would have
it: no keras_transformer, and no Keras code of ours (TensorFlow 2.21 imports
the keras package itself when it starts). The SavedModel is called twice, loaded
as TF2 objects (`tf.saved_model.load`) and loaded into a TF1 session by
signature tensor names, which is how TF Serving's C++ loader runs it.

    python serve_saved_model.py SAVED_MODEL INPUTS.json OUTPUTS.json

INPUTS.json is a list of strings, each the base64 of one input row's bytes.
"""

import base64
import json
import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

path, inputs_path, outputs_path = sys.argv[1:]
with open(inputs_path) as file:
    texts = [base64.b64decode(row) for row in json.load(file)]


def rows(outputs):
    return {
        "translation": [t.decode("utf-8") for t in outputs["translation"].tolist()],
        "score": [float(s) for s in outputs["score"].tolist()],
    }


serving_default = tf.saved_model.load(path).signatures["serving_default"]
eager = rows({k: v.numpy() for k, v in serving_default(text=tf.constant(texts, tf.string)).items()})

with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
    meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
    signature = meta_graph.signature_def["serving_default"]
    session_outputs = session.run(
        {name: info.name for name, info in signature.outputs.items()},
        feed_dict={signature.inputs["text"].name: texts},
    )

with open(outputs_path, "w") as file:
    json.dump(
        {
            "eager": eager,
            "session": rows(session_outputs),
            "modules": sorted(name for name in sys.modules if name.startswith("keras_transformer")),
        },
        file,
    )
