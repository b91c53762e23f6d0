"""Tiny random fairseq translators for the converters' tests: one in
transformers' FSMT layout (`save_pretrained`), one as fairseq writes it
(`model.pt`, `dict.{lang}.txt`, `bpecodes`), built offline.

The tokenizer is learned here: Moses tokens of the built-in corpus, BPE
merges learned with subword-nmt, and a source and a target vocabulary of
different sizes, the source's missing some pieces (so that <unk> occurs).
LayerNorm weights and biases are randomized (`randomize`): the ones and
zeros they start with would hide a porting error.
"""

import argparse
import collections
import io
import json
import os

from published_fixtures import corpus_sides
from published_fixtures import randomize

SENTENCES = [
    "The old man sees the dog.",
    "Today the cat helps the big teacher in the garden!",
    "A child reads \"books\" - and the zebra's x-ray costs 5,000 & more…",
    "The woman does not see the bird, because the mouse sleeps.",
]
LANGUAGES = ("en", "de")
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
MERGES = 300


def _moses_tokens(sentences, language):
    from sacremoses import MosesPunctNormalizer
    from sacremoses import MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=language), MosesTokenizer(lang=language)
    return [
        tokenizer.tokenize(normalizer.normalize(text), aggressive_dash_splits=True, escape=True) for text in sentences
    ]


def _vocabulary(sentences, language, bpe, size):
    """The `size` most frequent pieces (FSMT's spelling: "piece" inside a
    word, "piece</w>" at its end) after the four specials."""
    counts = collections.Counter()
    for tokens in _moses_tokens(sentences, language):
        for piece in bpe.segment_tokens(tokens):
            counts[piece[:-2] if piece.endswith("@@") else piece + "</w>"] += 1
    pieces = [piece for piece, _ in counts.most_common(size - len(SPECIALS))]
    return {piece: i for i, piece in enumerate(list(SPECIALS) + pieces)}


def learn_tokenizer(directory, source_size=150, target_size=190):
    """Writes `vocab-src.json`, `vocab-tgt.json` and `merges.txt` into
    `directory`; returns the subword-nmt codes (with their header)."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    english, german = corpus_sides()
    lines = [" ".join(tokens) for tokens in _moses_tokens(english, "en") + _moses_tokens(german, "de")]
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(lines) + "\n"), codes, MERGES, min_frequency=2)
    bpe = BPE(io.StringIO(codes.getvalue()))
    os.makedirs(directory, exist_ok=True)
    for name, sentences, language, size in (("vocab-src.json", english, "en", source_size),
                                            ("vocab-tgt.json", german, "de", target_size)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
            json.dump(_vocabulary(sentences, language, bpe, size), file, ensure_ascii=False, indent=2)
    merges = [line for line in codes.getvalue().splitlines() if line and not line.startswith("#version")]
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as file:
        file.write("\n".join(merges) + "\n")
    return codes.getvalue()


def fsmt_directory(directory, d_model=32, layers=2, heads=4, encoder_ffn=64, decoder_ffn=48, eos_bias=1.4, seed=0):
    """A random `FSMTForConditionalGeneration` with its tokenizer, saved
    into `directory`. Returns `(model, tokenizer, codes)`."""
    import torch
    from transformers import FSMTConfig
    from transformers import FSMTForConditionalGeneration
    from transformers import FSMTTokenizer

    codes = learn_tokenizer(directory)
    tokenizer = FSMTTokenizer(
        langs=list(LANGUAGES), src_vocab_file=os.path.join(directory, "vocab-src.json"),
        tgt_vocab_file=os.path.join(directory, "vocab-tgt.json"), merges_file=os.path.join(directory, "merges.txt"),
    )
    config = FSMTConfig(
        langs=list(LANGUAGES), src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
        d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_ffn_dim=encoder_ffn, decoder_ffn_dim=decoder_ffn,
        activation_function="gelu", max_position_embeddings=128, scale_embedding=True, tie_word_embeddings=False,
        # As published FSMT configs: EOS forced at the length limit.
        forced_eos_token_id=2, num_beams=4, length_penalty=1.0,
    )
    torch.manual_seed(seed)
    model = randomize(FSMTForConditionalGeneration(config).eval(), seed)
    decoder = model.model.decoder
    with torch.no_grad():  # logits of a unit or two, not FSMT's initial tenths
        for matrix, scale in ((model.model.encoder.embed_tokens, 0.3), (decoder.embed_tokens, 0.3),
                              (decoder.output_projection, 0.1)):
            matrix.weight.normal_(0.0, scale)
        # FSMT has no logits bias: the decoder's output coordinate 0, held
        # at 1, makes the projection's column 0 one; EOS's entry there
        # raises it, so that some searches end before their limit.
        norm = decoder.layers[-1].final_layer_norm
        norm.weight[0], norm.bias[0] = 0.0, 1.0
        decoder.output_projection.weight[config.eos_token_id, 0] = eos_bias
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer, codes


def _fairseq_dictionary(vocabulary):
    """fairseq's dict.txt: the pieces after the four implicit specials, in
    id order, spelt "piece@@" inside a word and "piece" at its end."""
    pieces = sorted(vocabulary, key=vocabulary.get)[len(SPECIALS):]
    lines = [
        (piece[:-4] if piece.endswith("</w>") else piece + "@@") + f" {100 - i // 2}" for i, piece in enumerate(pieces)
    ]
    return "\n".join(lines) + "\n"


def _old_attention(state, prefix):
    """fairseq before 2019 kept q, k and v in one `in_proj_weight`."""
    import torch

    for kind in ("weight", "bias"):
        state[f"{prefix}.in_proj_{kind}"] = torch.cat(
            [state.pop(f"{prefix}.{name}_proj.{kind}") for name in ("q", "k", "v")]
        )


def fairseq_directory(directory, model, codes, source_directory, args="args"):
    """`model`'s weights as fairseq's own checkpoint (`model.pt` with
    fairseq's names, the decoder's output tied to its input, older
    layouts of attention and norms in the encoder), with its dictionaries
    and BPE codes. Returns a copy of `model` tied the same way: the
    FSMT model the checkpoint holds."""
    import copy

    import torch

    os.makedirs(directory, exist_ok=True)
    model = copy.deepcopy(model)
    decoder = model.model.decoder
    with torch.no_grad():
        decoder.embed_tokens.weight.copy_(decoder.output_projection.weight)
    state = {name[len("model."):]: tensor.clone() for name, tensor in model.state_dict().items()
             if name.startswith("model.") and "embed_positions" not in name}
    del state["decoder.output_projection.weight"]
    config = model.config
    for i in range(config.encoder_layers):  # the decoder's keep today's names
        _old_attention(state, f"encoder.layers.{i}.self_attn")
        for old, new in (("0", "self_attn_layer_norm"), ("1", "final_layer_norm")):
            for kind in ("weight", "bias"):
                state[f"encoder.layers.{i}.layer_norms.{old}.{kind}"] = state.pop(f"encoder.layers.{i}.{new}.{kind}")
    state["encoder.version"] = torch.tensor([3.0])
    architecture = {
        "arch": "transformer_wmt_en_de_big", "source_lang": LANGUAGES[0], "target_lang": LANGUAGES[1],
        "encoder_embed_dim": config.d_model, "decoder_embed_dim": config.d_model,
        "encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.encoder_attention_heads,
        "decoder_attention_heads": config.decoder_attention_heads,
        "encoder_ffn_embed_dim": config.encoder_ffn_dim, "decoder_ffn_embed_dim": config.decoder_ffn_dim,
        "activation_fn": config.activation_function, "dropout": 0.1, "attention_dropout": 0.0,
        "encoder_normalize_before": False, "decoder_normalize_before": False, "no_scale_embedding": False,
        "share_all_embeddings": False, "share_decoder_input_output_embed": True,
        "max_source_positions": config.max_position_embeddings,
        "max_target_positions": config.max_position_embeddings,
        "encoder_learned_pos": False, "decoder_learned_pos": False, "bpe": "subword_nmt", "tokenizer": "moses",
    }
    checkpoint = {"model": state}
    if args == "args":  # fairseq's defaults of the search, as training saves them
        checkpoint["args"] = argparse.Namespace(**architecture, beam=5, lenpen=1.0)
    else:  # fairseq >= 0.10 saves its configuration as plain dictionaries
        checkpoint["cfg"] = {"model": architecture, "generation": {"beam": 3, "lenpen": 0.8}}
    torch.save(checkpoint, os.path.join(directory, "model.pt"))
    for name, language in (("vocab-src.json", LANGUAGES[0]), ("vocab-tgt.json", LANGUAGES[1])):
        with open(os.path.join(source_directory, name), encoding="utf-8") as file:
            vocabulary = json.load(file)
        with open(os.path.join(directory, f"dict.{language}.txt"), "w", encoding="utf-8") as file:
            file.write(_fairseq_dictionary(vocabulary))
    with open(os.path.join(directory, "bpecodes"), "w", encoding="utf-8") as file:
        file.write(codes)
    return model
