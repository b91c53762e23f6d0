"""fairseq's own translation checkpoints: `model.pt`, `dict.{src}.txt`,
`dict.{tgt}.txt` and `bpecodes`.

`model.pt` holds the weights (`checkpoint["model"]`) and the architecture
(`checkpoint["args"]`, or `checkpoint["cfg"]["model"]` since fairseq
0.10) of fairseq's `transformer`: the model transformers ported as FSMT,
so the checkpoint is read into FSMT's names (`fairseq_transformer`).
Older checkpoints keep a layer's query, key and value projections in one
`in_proj_weight` and an encoder block's norms as `layer_norms.0` and `.1`;
both are read. A dictionary
numbers its pieces after the implicit <s>, <pad>, </s>, <unk> (ids 0 to
3), one "piece count" a line, "piece@@" inside a word; it is rewritten in
FSMT's spelling for `MosesBpeTokenizer`.
"""

import argparse
import json
import os

import numpy as np

from keras_transformer.convert import fairseq_transformer
from keras_transformer.convert.checkpoint import ConversionError
from keras_transformer.convert.checkpoint import Tensors
from keras_transformer.convert.checkpoint import activation
from keras_transformer.convert.checkpoint import load_torch
from keras_transformer.convert.pipeline import Conversion
from keras_transformer.data.languages import pair_or_none
from keras_transformer.data.moses_bpe import END_OF_WORD
from keras_transformer.data.moses_bpe import SPECIAL_TOKENS
from keras_transformer.data.moses_bpe import MosesBpeTokenizer

# Options of fairseq's `transformer` that our blocks do not have, by what
# they would ask for: each must be off (unset, False, or None).
UNSUPPORTED = {
    "pre-LN blocks": ("encoder_normalize_before", "decoder_normalize_before"),
    "unscaled embeddings": ("no_scale_embedding",), "a norm on the embeddings": ("layernorm_embedding",),
    "learned positions": ("encoder_learned_pos", "decoder_learned_pos"),
    "no positions": ("no_token_positional_embeddings",), "cross+self attention": ("cross_self_attention",),
    "an adaptive softmax": ("adaptive_softmax_cutoff",), "adaptive inputs": ("adaptive_input",),
    "Moses without XML escapes": ("moses_no_escape",), "Moses without dash splits": ("moses_no_dash_splits",),
}
# Tensors only those options make: a checkpoint with one is not our model.
UNSUPPORTED_TENSORS = (
    "encoder.layer_norm.weight", "decoder.layer_norm.weight", "encoder.layernorm_embedding.weight",
    "decoder.layernorm_embedding.weight", "decoder.project_in_dim.weight", "decoder.project_out_dim.weight",
    "encoder.embed_positions.weight", "decoder.embed_positions.weight",
)


def read_checkpoint(path):
    """`model.pt` as saved: tensors, dicts and (old checkpoints')
    `argparse.Namespace`, nothing else unpickled."""
    return load_torch(path, safe_classes=[argparse.Namespace], expected=(
        '{"model": state dict, "args" or "cfg": ...}; a training checkpoint may hold other objects: keep those '
        "two keys"))


def architecture(checkpoint, path):
    """The model's settings (`args`, or `cfg["model"]`) as a dict, with
    the search's `beam` and `lenpen` where the checkpoint has them."""
    cfg = checkpoint.get("cfg") if isinstance(checkpoint.get("cfg"), dict) else {}
    args = cfg["model"] if cfg.get("model") is not None else checkpoint.get("args")
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    if not isinstance(args, dict) or not isinstance(checkpoint.get("model"), dict):
        raise ConversionError(
            f"{path} holds {sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__}. "
            'Expected fairseq\'s checkpoint: "model" (the state dict) and "args" or "cfg" {"model": ...}.'
        )
    generation = cfg.get("generation") if isinstance(cfg.get("generation"), dict) else args
    # fairseq-generate's and fairseq-interactive's defaults.
    return dict(args, beam=generation.get("beam", 5), lenpen=generation.get("lenpen", 1.0))


def check_architecture(args, tensors, path):
    """Refuses what our post-LN blocks and tokenizer cannot reproduce."""
    for meaning, names in UNSUPPORTED.items():
        for name in names:
            if args.get(name) not in (False, None):
                raise ConversionError(f"{path}: {name}={args[name]!r} ({meaning}) is not supported; expected it off.")
    found = [name for name in UNSUPPORTED_TENSORS if name in tensors]
    if found:
        raise ConversionError(f"{path} has the tensor {found[0]!r}, which fairseq's post-LN transformer lacks.")
    activation(args.get("activation_fn", "relu"), f"{path} (activation_fn)")
    for option, supported in (("bpe", ("subword_nmt", "fastbpe")), ("tokenizer", ("moses",))):
        if args.get(option) not in (None,) + supported:
            raise ConversionError(
                f"{path}: {option}={args[option]!r} is not supported; expected one of {list(supported)}."
            )


def upgraded(state):
    """The state dict as float32 NumPy, in today's names: `in_proj_weight`
    split into q, k and v (thirds, in that order); `layer_norms.0` and `.1`
    named as the norms they are."""
    found = {}
    for name, value in state.items():
        if not hasattr(value, "numpy") or name.endswith("_float_tensor") or name.endswith(".version"):
            continue
        value = value.float().numpy()
        if ".in_proj_" in name:
            prefix, kind = name.split(".in_proj_")
            for part, third in zip(("q", "k", "v"), np.split(value, 3)):
                found[f"{prefix}.{part}_proj.{kind}"] = third
            continue
        for old, new in ((".layer_norms.0.", ".self_attn_layer_norm."),
                         (".layer_norms.1.", ".final_layer_norm.")):
            name = name.replace(old, new)
        found[name] = value
    return found


def fsmt_layout(args, state, path):
    """An FSMT config dict and FSMT's tensors from fairseq's."""
    tensors = Tensors(state, path)
    source, target = tensors.first("encoder.embed_tokens.weight"), tensors.first("decoder.embed_tokens.weight")
    if args.get("share_all_embeddings") or args.get("share_decoder_input_output_embed"):
        output = target
    else:
        output = tensors.first("decoder.output_projection.weight", "decoder.embed_out")
    renamed = {f"model.{name}": value for name, value in state.items() if name.startswith(("encoder.", "decoder."))}
    renamed["model.decoder.output_projection.weight"] = output
    max_positions = max(args.get("max_source_positions", 1024), args.get("max_target_positions", 1024))
    config = {
        "src_vocab_size": len(source), "tgt_vocab_size": len(target),
        "d_model": args.get("encoder_embed_dim", source.shape[1]),
        "activation_function": args.get("activation_fn", "relu"),
        "max_position_embeddings": max_positions,
        "dropout": args.get("dropout", 0.1), "attention_dropout": args.get("attention_dropout", 0.0),
        "tie_word_embeddings": bool(args.get("share_all_embeddings")),
        "pad_token_id": 1, "decoder_start_token_id": 2, "eos_token_id": 2,
        "num_beams": args["beam"], "length_penalty": args["lenpen"],
    }
    for side in ("encoder", "decoder"):
        if f"{side}_attention_heads" not in args:
            raise ConversionError(f"{path} gives no {side}_attention_heads in its args; expected the architecture's.")
        config[f"{side}_attention_heads"] = args[f"{side}_attention_heads"]
        # Sizes the args leave out are the tensors'.
        layers = {int(name.split(".")[2]) for name in state if name.startswith(f"{side}.layers.")}
        config[f"{side}_layers"] = args.get(f"{side}_layers", len(layers))
        config[f"{side}_ffn_dim"] = args.get(f"{side}_ffn_embed_dim") or len(
            tensors.first(f"{side}.layers.0.fc1.weight")
        )
    if args.get("decoder_embed_dim", config["d_model"]) != config["d_model"]:
        raise ConversionError(
            f"{path}: encoder_embed_dim={config['d_model']} and decoder_embed_dim={args['decoder_embed_dim']}; "
            "expected one width."
        )
    return config, Tensors(renamed, path)


def read_dictionary(path, rows):
    """fairseq's dictionary in FSMT's spelling ("piece" inside a word,
    "piece</w>" at its end), ids from 4 on after the implicit specials."""
    if not os.path.isfile(path):
        found = sorted(name for name in os.listdir(os.path.dirname(path)) if name.startswith("dict."))
        raise ConversionError(
            f"No {os.path.basename(path)} beside model.pt. Expected it for the checkpoint's language; found {found}."
        )
    vocabulary = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    number = 0
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            fields = line.rstrip().rsplit(" ", 1)
            if len(fields) == 2 and fields[1] == "#fairseq:overwrite":
                fields = fields[0].rsplit(" ", 1)
            if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
                raise ConversionError(
                    f"{path}, line {number}: expected \"piece count\". Received: {line.rstrip()!r}"
                )
            piece = fields[0]
            spelt = piece[:-2] if piece.endswith("@@") else piece + END_OF_WORD
            vocabulary[spelt] = 4 + number - 1
    if 4 + number > rows:
        raise ConversionError(f"{path} has {4 + number} pieces, more than its embedding's {rows} rows.")
    return vocabulary


def read_merges(path):
    """`bpecodes` (fastBPE's "a b count" or subword-nmt's "a b" lines) as
    FSMT's `merges.txt`; a pair listed twice keeps its first rank."""
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    if lines and lines[0].startswith("#version"):
        if lines[0].split()[-1] != "0.2":
            raise ConversionError(f"{path} is subword-nmt's version {lines[0].split()[-1]}; expected 0.2.")
        lines = lines[1:]
    merges = dict.fromkeys(" ".join(line.split()[:2]) for line in lines if len(line.split()) >= 2)
    return ("\n".join(merges) + "\n").encode("utf-8")


def read(directory):
    """The fairseq checkpoint in `directory`, as a `Conversion`."""
    path = os.path.join(os.path.abspath(directory), "model.pt")
    checkpoint = read_checkpoint(path)
    if not isinstance(checkpoint, dict):
        raise ConversionError(f"{path} holds a {type(checkpoint).__name__}; expected fairseq's checkpoint dict.")
    args = architecture(checkpoint, path)
    state = upgraded(checkpoint["model"])
    check_architecture(args, state, path)
    config, tensors = fsmt_layout(args, state, path)
    model = fairseq_transformer.model_config(config, path)
    ids = fairseq_transformer.id_map(config)
    weights, sharing = fairseq_transformer.weights(config, tensors, ids)
    languages = args.get("source_lang"), args.get("target_lang")
    if None in languages:
        raise ConversionError(f"{path} names no source_lang and target_lang; expected the language pair.")
    files = {}
    for name, language, rows in (("vocab-src.json", languages[0], config["src_vocab_size"]),
                                 ("vocab-tgt.json", languages[1], config["tgt_vocab_size"])):
        vocabulary = read_dictionary(os.path.join(directory, f"dict.{language}.txt"), rows)
        files[name] = json.dumps(vocabulary, ensure_ascii=False, indent=1).encode("utf-8")
    # Older fairseq named the codes "code".
    codes = [os.path.join(directory, name) for name in ("bpecodes", "code")
             if os.path.isfile(os.path.join(directory, name))]
    if not codes:
        raise ConversionError(f"{directory} has no bpecodes. Expected the BPE codes beside model.pt.")
    files["merges.txt"] = read_merges(codes[0])
    tokenizer = MosesBpeTokenizer(files, ids, *languages)
    # fairseq's generator, too, ends a hypothesis with EOS at the length limit.
    settings = {"beam_size": int(args["beam"]), "alpha": float(args["lenpen"]), "length_penalty": "power",
                "force_eos": True, "languages": pair_or_none(*languages)}
    return Conversion(model, weights, sharing, tokenizer, settings, path)
