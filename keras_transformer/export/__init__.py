"""Export a Translator as a SavedModel that TF Serving loads."""

from keras_transformer.export.loading import load_saved_model
from keras_transformer.export.saved_model import IDS_SIGNATURE
from keras_transformer.export.saved_model import TEXT_SIGNATURE
from keras_transformer.export.saved_model import export_new_version
from keras_transformer.export.saved_model import export_saved_model

__all__ = ["IDS_SIGNATURE", "TEXT_SIGNATURE", "export_new_version", "export_saved_model", "load_saved_model"]
