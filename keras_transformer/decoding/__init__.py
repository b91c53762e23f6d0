"""Decoding with the cached decoder."""

from keras_transformer.decoding.greedy import greedy_translate

__all__ = ["greedy_translate"]
