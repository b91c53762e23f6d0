"""Weight quantization of a trained model, for decoding.

Keras's post-training quantization (`Model.quantize`) stores the kernels of
`Dense` and `EinsumDense` layers (here: the attention projections and the
feed-forward networks) as int8 with a scale per output unit, and quantizes
each activation row on the fly. `TokenEmbedding` quantizes the same way
(`layers/token_embedding.py`): its matrix as int8 with a scale per token,
so that the logits, the largest product of a decoding step, are an int8
product too. The layer norms and the position encoding stay in their float
dtype.
"""

import gc

import keras

from keras_transformer.layers.utils import sublayers

QUANTIZATION_MODES = ("int8",)


def check_quantization_mode(mode):
    """Raises ValueError unless `mode` is None or one of `QUANTIZATION_MODES`."""
    if mode is not None and mode not in QUANTIZATION_MODES:
        raise ValueError(
            f"quantize must be None or one of {', '.join(QUANTIZATION_MODES)}. "
            f"Received: quantize={mode!r}"
        )
    return mode


def _quantizable(layer):
    """Whether `layer` quantizes its own weights: a layer class of ours or
    Keras's whose `quantize` is not the base layer's refusal."""
    return type(layer).quantize is not keras.layers.Layer.quantize


def quantization_mode(model):
    """The mode `model`'s layers are quantized to, or None."""
    modes = {
        layer.quantization_mode
        for layer in sublayers(model)[1:]
        if getattr(layer, "quantization_mode", None)
    }
    if len(modes) > 1:
        raise ValueError(f"The model mixes quantization modes: {sorted(modes)}")
    return modes.pop() if modes else None


def quantized(model, mode="int8"):
    """A copy of the trained `Transformer` with its kernels quantized to `mode`.

    `model` itself is unchanged; a model already quantized to `mode` is
    returned as it is.
    """
    check_quantization_mode(mode)
    current = quantization_mode(model)
    if current == mode:
        return model
    if current is not None:
        raise ValueError(
            f"The model is already quantized to {current}; cannot quantize it "
            f"to {mode}. Load the float model instead."
        )
    copy = type(model).from_config(model.get_config())
    copy.set_weights(model.get_weights())
    quantize_in_place(copy, mode)
    return copy


def quantize_in_place(model, mode):
    """`model.quantize(mode)` of the layers that can be quantized: Keras
    warns of each other layer it is asked to quantize (layer norms,
    dropouts, the blocks that hold them).

    Keras collects garbage after each float kernel it drops, a pass over
    the whole heap each time: with the objects that exist now frozen out of
    those passes, the process's size no longer multiplies the layer count.
    One pass at the end frees what the dropped kernels held."""
    check_quantization_mode(mode)
    gc.freeze()
    try:
        model.quantize(mode, filters=_quantizable)
    finally:
        gc.unfreeze()
    gc.collect()
