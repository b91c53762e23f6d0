"""transformers' `MarianMTModel` of our presets' sizes, as a decoding peer
(`decoding_engines.py` on the CPU, `gpu_decoding.py` on a GPU)."""

import numpy as np

MARIAN_EOS, MARIAN_UNK = 0, 1


def marian_tokens(vocabulary_size):
    """Marian's vocabulary layout: EOS first, UNK, then words, PAD last."""
    words = [f"w{i}" for i in range(2, vocabulary_size - 1)]
    return ["</s>", "<unk>"] + words + ["<pad>"]


def random_marian(config):
    """A `MarianMTModel` of the preset's size (post-LN, ReLU, sinusoids,
    scaled and shared embeddings, as ours), with transformers' random
    initialisation."""
    import transformers

    vocabulary_size = config["vocabulary_size"]
    marian_config = transformers.MarianConfig(
        vocab_size=vocabulary_size,
        d_model=config["d_model"],
        encoder_layers=config["num_layers"],
        decoder_layers=config["num_layers"],
        encoder_attention_heads=config["num_heads"],
        decoder_attention_heads=config["num_heads"],
        encoder_ffn_dim=config["d_ff"],
        decoder_ffn_dim=config["d_ff"],
        activation_function="relu",
        max_position_embeddings=512,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        eos_token_id=MARIAN_EOS,
        pad_token_id=vocabulary_size - 1,
        decoder_start_token_id=vocabulary_size - 1,
    )
    return transformers.MarianMTModel(marian_config).eval()


def transformers_contender(marian, beam_size, output_length, alpha=0.6):
    """`prepare(source_ids)` -> `decode()`, which runs `generate` on the
    model's device and returns each output's length."""
    import torch

    device = next(marian.parameters()).device

    def prepare(source_ids):
        input_ids = torch.from_numpy(marian_source(source_ids)).long().to(device)
        attention_mask = torch.ones_like(input_ids)

        def decode():
            with torch.inference_mode():
                output = marian.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    num_beams=beam_size,
                    do_sample=False,
                    max_new_tokens=output_length,
                    min_new_tokens=output_length,
                    **({"length_penalty": alpha} if beam_size > 1 else {}),
                )
            # The first position is the decoder's start token.
            return list(np.count_nonzero(output[:, 1:].cpu().numpy() != marian.config.pad_token_id, axis=1))

        return decode

    return prepare


def marian_source(source_ids):
    """Our source ids (words, then EOS) as Marian's: the same words, Marian's EOS."""
    marian = source_ids.copy()
    marian[:, -1] = MARIAN_EOS
    return marian
