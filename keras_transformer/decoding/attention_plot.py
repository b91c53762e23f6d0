"""Pictures of where the decoder looks: cross-attention heatmaps.

Section 3.2.3: in "encoder-decoder attention" layers every target position
attends over all source positions. Their weights show which source words
each target word was translated from (the paper's appendix plots
self-attention weights the same way).
"""

import numpy as np
from keras import ops


def cross_attention_map(translator, text, layer=-1):
    """Translates `text` and returns the weights its decoder gave the source.

    Args:
        translator: a `Translator`.
        text: one source sentence.
        layer: which decoder block; -1 is the last.

    Returns:
        `(translation, source_pieces, target_pieces, weights)`: the
        translation, the source subwords with EOS, its subwords with EOS,
        and float
        `[len(target_pieces), len(source_pieces)]` weights averaged over
        heads. Row t is the query that predicted target piece t.
    """
    blocks = translator.model.num_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not -blocks <= layer < blocks:
        raise ValueError(
            f"The model has {blocks} decoder blocks, so layer must be an "
            f"integer from {-blocks} to {blocks - 1} (-1 is the last). "
            f"Received: layer={layer!r}"
        )
    found = translator.search([text])
    if not found:
        raise ValueError(
            "There is nothing to plot for an empty or whitespace-only line. "
            f"Received: text={text!r}"
        )
    source_ids, ids, _ = found[0]
    target_ids = list(ids[0])
    eos_id = translator.tokenizer.eos_id
    target_ids = target_ids[: target_ids.index(eos_id) + 1] if eos_id in target_ids else target_ids
    target_ids = [t for t in target_ids if t != 0]
    decoder_input = np.array([[translator.tokenizer.bos_id] + target_ids[:-1]], "int32")
    weights = translator.model.cross_attention_weights(
        np.array([source_ids], "int32"), decoder_input
    )[layer]
    weights = ops.convert_to_numpy(ops.mean(weights[0], axis=0))  # [T, S]
    translation = translator.tokenizer.detokenize(target_ids)
    return (
        translation,
        _pieces(translator.tokenizer, source_ids),
        _pieces(translator.tokenizer, target_ids),
        weights,
    )


def plot_cross_attention(translator, text, path, layer=-1):
    """Saves the cross-attention heatmap of `text`'s translation as a PNG.

    Source subwords run along the x-axis and target subwords down the
    y-axis; a cell's shade is the attention weight, averaged over heads.

    Args:
        translator: a `Translator`.
        text: one source sentence.
        path: where to write the PNG.
        layer: which decoder block; -1 is the last.

    Returns:
        The translation (a string).
    """
    # The object-oriented API draws without pyplot, so no GUI backend or
    # global state is touched.
    from matplotlib.figure import Figure

    translation, source_pieces, target_pieces, weights = cross_attention_map(translator, text, layer)
    figure = Figure(
        figsize=(1.0 + 0.45 * len(source_pieces), 1.0 + 0.4 * len(target_pieces)),
        layout="constrained",
    )
    axes = figure.subplots()
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, aspect="auto")
    axes.set_xticks(range(len(source_pieces)), source_pieces, rotation=90)
    axes.set_yticks(range(len(target_pieces)), target_pieces)
    axes.set_xlabel("source")
    axes.set_ylabel("translation")
    block = layer if layer >= 0 else translator.model.num_layers + layer
    axes.set_title(f"encoder-decoder attention, decoder block {block}, mean of heads")
    figure.colorbar(image, ax=axes)
    figure.savefig(path, format="png", dpi=100)
    return translation


def _pieces(tokenizer, ids):
    return tokenizer.id_to_piece(ids)
