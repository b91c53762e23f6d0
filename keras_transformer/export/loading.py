"""An export loaded back in Python, with the operations its graph runs."""

import os


def load_saved_model(path):
    """The SavedModel at `path` (`export_saved_model`'s), loaded by
    TensorFlow for use in Python: its `signatures["serving_default"]`
    translates text, `signatures["translate_ids"]` ids.

    The text signature tokenizes with tensorflow-text's SentencePiece
    operations, which TensorFlow knows only once `tensorflow_text` is
    imported (TF Serving's build has them); this imports it first.
    """
    try:
        import tensorflow_text  # noqa: F401 - registers the SentencePiece operations
    except ImportError:
        raise ImportError(
            "Loading an export needs tensorflow-text, whose SentencePiece operations its text signature runs. "
            'Expected it installed: pip install -e ".[export]"'
        ) from None
    import tensorflow as tf

    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(f"No saved_model.pb in {path!r}. Expected a directory that export_saved_model wrote.")
    return tf.saved_model.load(path)
