"""Tiny random M2M-100 and NLLB-200 translators, built offline with
transformers from their configs and saved with `save_pretrained`, with the
tokenizer files their hub repositories hold."""

import io
import json
import os

import sentencepiece

from published_fixtures import SENTENCES
from published_fixtures import corpus_sides
from published_fixtures import randomize

EOS = 2  # fairseq's </s>, where decoding starts
# A few of NLLB-200's codes, and M2M-100's WMT21 list (its smallest).
LINEAR_GAIN = 1.0
NLLB_LANGUAGES = ["deu_Latn", "eng_Latn", "fra_Latn", "fra_Arab", "spa_Latn"]


def _bpe_model(vocabulary_size=180):
    """A SentencePiece BPE model of both sides, numbered as NLLB's and
    M2M-100's: <unk> 0, <s> 1, </s> 2."""
    english, german = corpus_sides()
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(english + german), model_writer=model, vocab_size=vocabulary_size, model_type="bpe",
        minloglevel=2,
    )
    return model.getvalue()


def _tokenizer(directory, kind):
    """transformers' tokenizer of `kind`, its files saved in `directory`."""
    from transformers import M2M100Tokenizer
    from transformers import NllbTokenizer

    spm = os.path.join(directory, "sentencepiece.bpe.model")
    with open(spm, "wb") as file:
        file.write(_bpe_model())
    if kind == "nllb":
        tokenizer = NllbTokenizer.from_pretrained(directory, src_lang="eng_Latn", tgt_lang="deu_Latn",
                                                  extra_special_tokens=NLLB_LANGUAGES)
    else:
        processor = sentencepiece.SentencePieceProcessor(model_file=spm)
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        vocab |= {processor.id_to_piece(i): i + 1 for i in range(3, processor.vocab_size())}
        with open(os.path.join(directory, "vocab.json"), "w") as file:
            json.dump(vocab, file)
        tokenizer = M2M100Tokenizer(os.path.join(directory, "vocab.json"), spm, src_lang="en", tgt_lang="de",
                                    language_codes="wmt21")
    tokenizer.save_pretrained(directory)
    return tokenizer


def m2m100_directory(directory, kind="m2m100", d_model=32, layers=2, heads=4, ffn=64, seed=0):
    """A random `M2M100ForConditionalGeneration` with `kind`'s tokenizer
    ("m2m100" or "nllb"), saved into `directory`. Returns `(model,
    tokenizer)`."""
    import torch
    from transformers import M2M100Config
    from transformers import M2M100ForConditionalGeneration

    os.makedirs(directory, exist_ok=True)
    tokenizer = _tokenizer(directory, kind)
    # Published configs count a few ids past the tokenizer's (M2M-100's made-up words).
    config = M2M100Config(
        vocab_size=len(tokenizer) + 8, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        max_position_embeddings=128, scale_embedding=True, activation_function="relu", dropout=0.0,
        decoder_start_token_id=EOS, num_beams=4, length_penalty=1.0,
        tokenizer_class="NllbTokenizer" if kind == "nllb" else "M2M100Tokenizer",
    )
    torch.manual_seed(seed)
    model = randomize(M2M100ForConditionalGeneration(config).eval(), seed)
    with torch.no_grad():  # logits of a unit or two, and some searches that end early
        model.model.shared.weight.normal_(0.0, 0.3)
        # Pre-LN blocks add their outputs to the scaled embedding: of unit
        # gain, not transformers' initial 0.02, so that the embedding does
        # not outweigh them and the next token is not the last one again.
        for name, linear in model.model.named_modules():
            if isinstance(linear, torch.nn.Linear):
                linear.weight.normal_(0.0, LINEAR_GAIN / linear.in_features**0.5)
                if name.endswith("fc2"):  # ReLU's mean, the same for every input, adds nothing
                    linear.weight.sub_(linear.weight.mean(dim=1, keepdim=True))
        # The decoder's last norm holds output coordinate 0 at a constant,
        # which raises EOS's logit by its entry there: the first constant
        # that ends some of the greedy outputs before their limit, not all.
        norm = model.model.decoder.layer_norm
        norm.weight[0] = 0.0
        model.model.shared.weight[EOS, 0] = 1.5
        for constant in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0):
            norm.bias[0] = constant
            if 0 < _ended(model, tokenizer) < len(SENTENCES):
                break
        else:
            raise AssertionError("No constant ends some greedy outputs but not all")
    model.save_pretrained(directory)
    return model, tokenizer


def _ended(model, tokenizer, extra=10):
    """How many of the greedy outputs of SENTENCES end with EOS within
    `extra` tokens more than their sources."""
    language = tokenizer.convert_tokens_to_ids(tokenizer.get_lang_token(tokenizer.tgt_lang)
                                               if hasattr(tokenizer, "get_lang_token") else tokenizer.tgt_lang)
    ended = 0
    for sentence in SENTENCES:
        inputs = tokenizer([sentence], return_tensors="pt")
        generated = model.generate(**inputs, forced_bos_token_id=language, num_beams=1, do_sample=False,
                                   max_new_tokens=inputs["input_ids"].shape[1] - 1 + extra)
        ended += EOS in generated[0, 1:].tolist()
    return ended
