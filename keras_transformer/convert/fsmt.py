"""fairseq's WMT19 translators in transformers' layout (FSMT): config,
weights and tokenizer.

`FSMTForConditionalGeneration` is fairseq's `transformer`
(`fairseq_transformer`). Its tokenizer is Moses and BPE
(`MosesBpeTokenizer`). Its search divides a hypothesis's log-probability
by length^alpha, and published configs force EOS at the length limit.
"""

import os

from keras_transformer.convert import fairseq_transformer
from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.convert.checkpoint import read_config
from keras_transformer.convert.checkpoint import read_tensors
from keras_transformer.convert.checkpoint import search_settings
from keras_transformer.convert.pipeline import Conversion
from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.languages import pair_or_none
from keras_transformer.data.moses_bpe import MosesBpeTokenizer

MODEL_TYPE = "fsmt"


def tokenizer_settings(directory, config):
    """The languages and lowercasing of FSMT's tokenizer, from
    `tokenizer_config.json` (else config.json's `langs`)."""
    path = os.path.join(directory, "tokenizer_config.json")
    settings = read_json_object(path) if os.path.isfile(path) else {}
    languages = settings.get("langs") or config.get("langs")
    if not isinstance(languages, (list, tuple)) or len(languages) != 2:
        raise ConversionError(
            f"{directory}: tokenizer_config.json and config.json name no language pair; expected langs such as "
            f'["en", "de"]. Received: langs={languages!r}'
        )
    return languages, bool(settings.get("do_lower_case", False))


def read(directory):
    """The FSMT checkpoint in `directory`, as a `Conversion`."""
    config = read_config(directory, MosesBpeTokenizer.FILES, "FSMT's tokenizer files")
    source = os.path.abspath(directory)
    languages, lowercase = tokenizer_settings(directory, config)
    unknown = read_json_object(os.path.join(directory, "vocab-src.json")).get("<unk>", 3)
    model = fairseq_transformer.model_config(config, source)
    ids = fairseq_transformer.id_map(config, unknown)
    weights, sharing = fairseq_transformer.weights(config, read_tensors(directory), ids)
    tokenizer = MosesBpeTokenizer.from_directory(
        directory, ids, source_language=languages[0], target_language=languages[1], lowercase=lowercase
    )
    settings = search_settings(directory, config) | {"languages": pair_or_none(*languages)}
    return Conversion(model, weights, sharing, tokenizer, settings, source)
