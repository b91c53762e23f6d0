"""Greedy translation with the cached decoder, one position at a time."""

import keras
import numpy as np


def greedy_translate(model, tokenizer, sentences, max_extra_length=50, batch_size=64):
    """Translates sentences by taking the most likely token at each step.

    A plain eager loop over `Transformer.decode_step`, which reads and
    writes the key/value cache, so the prefix is never recomputed. Outputs
    stop at EOS or at source length + `max_extra_length` tokens (the paper's
    limit for beam search is input length + 50).

    Args:
        model: a trained `Transformer`.
        tokenizer: its `SubwordTokenizer`.
        sentences: a list of source strings.
        max_extra_length: how many tokens an output may exceed its source by.
        batch_size: sentences decoded together.

    Returns:
        A list of detokenized translations, aligned with `sentences`.
    """
    translations = []
    for start in range(0, len(sentences), batch_size):
        batch = list(sentences[start : start + batch_size])
        ids = tokenizer.tokenize(batch).to_tensor().numpy()  # padded with 0
        source_ids = np.pad(ids, [(0, 0), (0, 1)])
        source_ids[np.arange(len(batch)), (source_ids != 0).sum(1)] = tokenizer.eos_id
        max_length = source_ids.shape[1] + max_extra_length
        encoder_output, encoder_padding_mask = model.encode(source_ids)
        cache = model.initial_cache(encoder_output, max_length)
        tokens = np.full((len(batch), 1), tokenizer.bos_id, "int32")
        outputs = np.zeros((len(batch), max_length), "int32")
        finished = np.zeros(len(batch), bool)
        for index in range(max_length):
            logits, cache = model.decode_step(tokens, cache, index, encoder_padding_mask)
            tokens = np.argmax(keras.ops.convert_to_numpy(logits), -1).astype("int32")
            outputs[:, index] = np.where(finished, 0, tokens[:, 0])
            finished |= tokens[:, 0] == tokenizer.eos_id
            if finished.all():
                break
        translations += [t.decode("utf-8") for t in tokenizer.detokenize(outputs).numpy()]
    return translations
