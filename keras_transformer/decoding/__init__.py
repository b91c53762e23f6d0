"""Decoding: beam and greedy search over a step function, and translation."""

from keras_transformer.decoding.attention_plot import cross_attention_map
from keras_transformer.decoding.attention_plot import plot_cross_attention
from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.beam_search import length_penalty
from keras_transformer.decoding.greedy_search import greedy_search
from keras_transformer.decoding.settings import SearchSettings
from keras_transformer.decoding.streaming import translate_file
from keras_transformer.decoding.translator import Translator
from keras_transformer.decoding.steps import cache_lengths
from keras_transformer.decoding.steps import cached_step_function
from keras_transformer.decoding.steps import grow_cache
from keras_transformer.decoding.steps import growing_step_function
from keras_transformer.decoding.steps import search_translations

__all__ = [
    "SearchSettings",
    "Translator",
    "beam_search",
    "cache_lengths",
    "cached_step_function",
    "cross_attention_map",
    "greedy_search",
    "grow_cache",
    "growing_step_function",
    "length_penalty",
    "plot_cross_attention",
    "search_translations",
    "translate_file",
]
