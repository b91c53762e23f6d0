"""From data to model-ready batches."""

from keras_transformer.data.synthetic import reversal_task

__all__ = ["reversal_task"]
