"""Tiny random published translators, built offline with transformers and
saved with `save_pretrained`, for the converters' tests.

Their LayerNorm weights and biases and the logits bias are randomized:
the ones and zeros they start with would hide a porting error.
"""

import io
import json
import os

import numpy as np
import sentencepiece

from keras_transformer.data.builtin import builtin_corpus

SENTENCES = [
    "The old man sees the dog.",
    "Today the cat helps the big teacher in the garden.",
    "A child reads.",
    "The woman does not see the bird, because the mouse sleeps.",
]


def corpus_sides(size=400):
    pairs = list(builtin_corpus("train", size=size))
    return [source for source, _ in pairs], [target for _, target in pairs]


def _sentencepiece_model(sentences, vocabulary_size):
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocabulary_size,
        model_type="unigram", minloglevel=2, bos_id=-1, eos_id=1, unk_id=0, pad_id=-1,
    )
    return model.getvalue()


def randomize(model, seed=0):
    """Every LayerNorm weight and bias, and any logits bias, drawn at random."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))
    return model


def marian_directory(directory, d_model=32, layers=2, heads=4, ffn=64, vocabulary=120, separate=False, seed=0,
                     eos_bias=0.0, forced_eos=False):
    """A random `MarianMTModel` with its tokenizer (two SentencePiece models
    and vocab.json, or with `separate` a target_vocab.json too), saved into
    `directory`, its EOS logit raised by `eos_bias` so that searches end,
    and with `forced_eos` EOS forced at the length limit (as published
    OPUS-MT configs set `forced_eos_token_id`). Returns the model and
    transformers' tokenizer."""
    import torch
    from transformers import MarianConfig
    from transformers import MarianMTModel
    from transformers import MarianTokenizer

    os.makedirs(directory, exist_ok=True)
    english, german = corpus_sides()
    raw = os.path.join(directory, "raw")
    os.makedirs(raw, exist_ok=True)
    for name, side in (("source.spm", english), ("target.spm", german)):
        with open(os.path.join(raw, name), "wb") as file:
            file.write(_sentencepiece_model(side, 60))
    pieces = []
    for name in ("source.spm", "target.spm"):
        processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(raw, name))
        pieces += [processor.id_to_piece(i) for i in range(2, processor.vocab_size())]
    # A multilingual model's target-language token, as Marian's have.
    ordered = ["</s>", "<unk>", ">>deu<<"] + list(dict.fromkeys(pieces))[: vocabulary - 4]
    vocab = {piece: i for i, piece in enumerate(ordered)}
    vocab["<pad>"] = len(vocab)
    with open(os.path.join(raw, "vocab.json"), "w") as file:
        json.dump(vocab, file)
    target_vocab = None
    if separate:  # the target's own numbering: a smaller, shuffled vocabulary
        target_pieces = ordered[3:-8]
        np.random.default_rng(seed).shuffle(target_pieces)
        target_vocab = {piece: i for i, piece in enumerate(["</s>", "<unk>"] + target_pieces)}
        target_vocab["<pad>"] = len(vocab) - 1  # transformers has one padding id for both sides
        with open(os.path.join(raw, "target_vocab.json"), "w") as file:
            json.dump(target_vocab, file)
    tokenizer = MarianTokenizer(
        os.path.join(raw, "source.spm"), os.path.join(raw, "target.spm"), os.path.join(raw, "vocab.json"),
        target_vocab_file=os.path.join(raw, "target_vocab.json") if separate else None,
        separate_vocabs=separate, source_lang="en", target_lang="de",
    )
    config = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        max_position_embeddings=128, activation_function="swish", scale_embedding=True,
        pad_token_id=len(vocab) - 1, decoder_start_token_id=len(vocab) - 1, eos_token_id=0, forced_eos_token_id=0 if forced_eos else None,
        share_encoder_decoder_embeddings=not separate, num_beams=4, length_penalty=1.0,
    )
    torch.manual_seed(seed)
    model = randomize(MarianMTModel(config).eval(), seed)
    with torch.no_grad():
        model.final_logits_bias[0, config.eos_token_id] += eos_bias
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def remove_tensors(directory, *names):
    """Rewrites `directory/model.safetensors` without `names`, as some
    published checkpoints are saved (transformers then loads those
    tensors with their defaults)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = os.path.join(directory, "model.safetensors")
    with safe_open(path, framework="np") as file:
        metadata = file.metadata()
        found = set(file.keys())
        tensors = {name: file.get_tensor(name) for name in found - set(names)}
    assert set(names) <= found, f"{path} lacks {sorted(set(names) - found)} already"
    save_file(tensors, path, metadata=metadata)


# Search options, ours (`SearchSettings` fields) and `generate`'s, each
# with the option it tests named: the random models' outputs are short,
# so the repetition options are tried on outputs of at least 10 tokens.
SEARCH_OPTIONS = [
    ("min_length", {"min_length": 10}),
    ("repetition_penalty", {"min_length": 10, "repetition_penalty": 1.3}),
    ("no_repeat_ngram_size", {"min_length": 10, "no_repeat_ngram_size": 2}),
]


def searches_equal_generate(model, tokenizer, translator, max_extra_length, sentences=SENTENCES, **generate):
    """Asserts that `translator`'s search gives transformers' `generate`'s
    best ids (and, with a beam, score) for each of `sentences`, with the
    translator's beam and alpha, our per-sentence limit and `generate`'s
    other arguments. Returns transformers' ids of each, to the first EOS."""
    import torch

    eos = model.config.eos_token_id
    found = translator.search(sentences)
    generated = []
    for i, sentence in enumerate(sentences):
        source_ids, ids, scores = found[i]
        limit = len(source_ids) - 1 + max_extra_length
        with torch.no_grad():
            output = model.generate(
                **tokenizer([sentence], return_tensors="pt"), num_beams=translator.beam_size, do_sample=False,
                max_new_tokens=limit, length_penalty=translator.alpha, output_scores=True,
                early_stopping=translator.early_stopping if translator.beam_size > 1 else False, return_dict_in_generate=True,
                **generate,
            )
        theirs = output.sequences[0, 1:].tolist()
        theirs = theirs[: theirs.index(eos) + 1] if eos in theirs else theirs
        ours = translator.tokenizer.id_map.to_published(ids[0].tolist())
        ours = ours[: ours.index(eos) + 1] if eos in ours else ours[:limit]
        assert ours == theirs, f"sentence {i}: ours {ours}, transformers' {theirs}"
        if translator.beam_size > 1:
            np.testing.assert_allclose(scores[0], output.sequences_scores[0].item(), atol=1e-4)
        generated.append(theirs)
    return generated


def options_search_as_generate(model, tokenizer, translator, max_extra_length, plain, sentences=SENTENCES, **generate):
    """Asserts, for each of `SEARCH_OPTIONS`, that `translator` with the
    options searches as `generate` with the same (and `generate`'s other
    arguments), from `plain`, `searches_equal_generate`'s outputs without
    options, on. Returns the names of the options that changed some
    outputs (a test asserts that each did, for its comparisons to count)."""
    found, changed = {(): plain}, set()
    for name, options in SEARCH_OPTIONS:
        found[tuple(options.items())] = searches_equal_generate(
            model, tokenizer, translator.with_search(**options), max_extra_length, sentences, **generate, **options
        )
        without = tuple((key, value) for key, value in options.items() if key != name)
        if found[tuple(options.items())] != found[without]:
            changed.add(name)
    return changed


# Targets for the scores' tests: sentences of the corpus's target side, and
# characters its vocabulary lacks.
TARGETS = [
    "Der alte Mann sieht den Hund.",
    "Heute hilft die Katze dem großen Lehrer im Garten.",
    "Ein Kind liest ✓.",
    "Die Frau sieht den Vogel nicht, weil die Maus schläft.",
]


def scores_equal_transformers(model, tokenizer, translator, sources=SENTENCES, targets=TARGETS, labelled=True):
    """Asserts that `translator.score` gives each pair the log-probability
    of transformers' teacher-forced forward pass (its target's tokens and
    EOS; the translator's forced prefix, such as a target language, left
    out as it counts 0 in both searches), within 1e-4. The target's ids are
    the tokenizer's (`text_target`), or with `labelled=False`, for a
    tokenizer that cannot encode targets (FSMT's), our tokenizer's in the
    published numbering. Returns our scores."""
    import torch

    forced = len(translator.target_prefix or [])
    ours = translator.score(sources, targets, token_scores=True)
    for i, (source, target) in enumerate(zip(sources, targets)):
        inputs = tokenizer([source], text_target=[target] if labelled else None, return_tensors="pt")
        if labelled:
            labels = inputs.pop("labels")
        else:
            ids = translator.tokenizer.tokenize_target([target])[0] + [translator.tokenizer.eos_id]
            labels = torch.tensor([translator.tokenizer.id_map.to_published(ids)])
        start = torch.full((1, 1), model.config.decoder_start_token_id, dtype=labels.dtype)
        with torch.no_grad():
            logits = model(**inputs, decoder_input_ids=torch.cat([start, labels[:, :-1]], dim=1), use_cache=False).logits
        theirs = torch.log_softmax(logits.double(), dim=-1)[0].gather(-1, labels[0, :, None])[forced:, 0].numpy()
        assert ours[i].tokens == len(theirs), (i, ours[i].tokens, len(theirs))
        np.testing.assert_allclose(ours[i].token_log_probabilities, theirs, atol=1e-4)
        np.testing.assert_allclose(ours[i].log_probability, theirs.sum(), atol=1e-4)
    return ours
