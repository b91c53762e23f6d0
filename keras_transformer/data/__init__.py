"""From parallel text to model-ready batches.

- `read_parallel_text`, `read_tfds`: sentence pairs, with what was skipped.
- `read_lines`: the lines of one UTF-8 text file.
- `SubwordTokenizer`: the shared subword vocabulary, on SentencePiece.
- `make_dataset`: token-bucketed batches of a corpus in memory.
- `prepare_dataset`, `load_prepared`: a corpus tokenized once into
  memory-mapped arrays, for corpora of any size.
- `TokenBatches`: token-bucketed batches of either, for `model.fit`.
- `builtin_corpus`: a generated English-German corpus that needs no data.
- `read_wmt14`: the paper's WMT14 En-De, from TFDS or local files.
- `reversal_task`: a synthetic task to check that a model learns at all.
"""

from keras_transformer.data.batches import TokenBatches
from keras_transformer.data.builtin import builtin_corpus
from keras_transformer.data.corpus import ParallelCorpus
from keras_transformer.data.corpus import read_lines
from keras_transformer.data.corpus import read_parallel_text
from keras_transformer.data.corpus import read_tfds
from keras_transformer.data.pipeline import batch_statistics
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.prepared import load_prepared
from keras_transformer.data.prepared import prepare_dataset
from keras_transformer.data.synthetic import reversal_task
from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.data.wmt14 import read_wmt14

__all__ = [
    "ParallelCorpus",
    "SubwordTokenizer",
    "TokenBatches",
    "batch_statistics",
    "builtin_corpus",
    "load_prepared",
    "make_dataset",
    "prepare_dataset",
    "read_lines",
    "read_parallel_text",
    "read_tfds",
    "read_wmt14",
    "reversal_task",
]
