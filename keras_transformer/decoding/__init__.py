"""Decoding: beam and greedy search over a step function, and translation."""

from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.beam_search import greedy_search
from keras_transformer.decoding.beam_search import length_penalty
from keras_transformer.decoding.greedy import greedy_translate

__all__ = ["beam_search", "greedy_search", "greedy_translate", "length_penalty"]
