"""English constituency parsing with the Transformer (section 6.3): treebank
trees, their linearization, EVALB's bracket scores, and a parser whose beam
search writes only well-formed trees."""

from keras_transformer.parsing.evalb import bracket_scores
from keras_transformer.parsing.evalb import brackets
from keras_transformer.parsing.linearization import ParsingVocabulary
from keras_transformer.parsing.linearization import delinearize
from keras_transformer.parsing.linearization import linearize
from keras_transformer.parsing.linearization import right_branching
from keras_transformer.parsing.parser import Parser
from keras_transformer.parsing.parser import well_formed_steps
from keras_transformer.parsing.treebank import Tree
from keras_transformer.parsing.treebank import clean
from keras_transformer.parsing.treebank import label_counts
from keras_transformer.parsing.treebank import read_treebank

__all__ = [
    "Parser",
    "ParsingVocabulary",
    "Tree",
    "bracket_scores",
    "brackets",
    "clean",
    "delinearize",
    "label_counts",
    "linearize",
    "read_treebank",
    "right_branching",
    "well_formed_steps",
]
