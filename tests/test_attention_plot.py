"""Cross-attention maps and their plots (keras_transformer/decoding/attention_plot.py)."""

import numpy as np
import pytest
from conftest import in_one_pass
from conftest import to_numpy
from translation_fixtures import SENTENCES
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)
from translation_fixtures import source_batch

from keras_transformer.decoding import Translator
from keras_transformer.decoding import cross_attention_map
from keras_transformer.decoding import plot_cross_attention


def test_cross_attention_map_rows_are_distributions_over_the_source(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=6)
    translation, source_pieces, target_pieces, weights = cross_attention_map(translator, SENTENCES[0])
    assert source_pieces[-1] == "</s>" and "".join(source_pieces[:-1]).replace("▁", " ").strip() == SENTENCES[0]
    assert weights.shape == (len(target_pieces), len(source_pieces))
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
    assert translation == translator.translate([SENTENCES[0]])[0]
    # Padding the source does not move any weight onto the padding.
    source_ids = source_batch(tokenizer, SENTENCES[:1])
    padded = np.pad(source_ids, [(0, 0), (0, 3)])
    decoder_input = np.array([[tokenizer.bos_id, 10, 11]], "int32")
    unpadded_weights = to_numpy(model.cross_attention_weights(source_ids, decoder_input)[-1])
    padded_weights = to_numpy(model.cross_attention_weights(padded, decoder_input)[-1])
    np.testing.assert_allclose(padded_weights[..., : source_ids.shape[1]], unpadded_weights, atol=1e-6)
    assert np.all(padded_weights[..., source_ids.shape[1] :] == 0)


@in_one_pass("torch", "matplotlib's drawing of the weights; each backend's weights are tested above")
def test_attention_plot_is_a_png_heatmap(model, tokenizer, tmp_path):
    from matplotlib.image import imread

    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=6)
    short_path, long_path = tmp_path / "short.png", tmp_path / "long.png"
    plot_cross_attention(translator, "the cat .", short_path)
    plot_cross_attention(translator, SENTENCES[6], long_path)
    short, long = imread(short_path), imread(long_path)
    assert open(short_path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert long.shape[1] > short.shape[1]  # one column per source piece
    with pytest.raises(ValueError, match="nothing to plot for an empty"):
        plot_cross_attention(translator, "  ", tmp_path / "empty.png")
