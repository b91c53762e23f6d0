"""Fine-tuning a converted Marian translator on Multi30k: validation loss and
BLEU before and after `keras-transformer train --init-from`.

    python benchmarks/fine_tuning.py --multi30k ../shared/data/multi30k --steps 600 \
        --json benchmarks/results/fine_tuning_marian_multi30k.json

No published weights can be downloaded here, so the converted model is a
random `MarianMTModel` (3+3 layers, d_model 256, swish, a logits bias) in
OPUS-MT's layout: SentencePiece models trained on Multi30k's English and
German sides and one `vocab.json` over both, as OPUS-MT ships them. It is
saved with `save_pretrained`, converted with `keras-transformer convert`,
scored on `val` (greedy BLEU and the loss), fine-tuned on `train` with the
paper's schedule, and scored again. `test2016` is not read.
"""

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time

import sentencepiece


def marian_layout(directory, multi30k, vocabulary_size, seed=0):
    """A random `MarianMTModel` and its tokenizer files, saved in `directory`."""
    import torch
    import transformers

    os.makedirs(directory, exist_ok=True)
    pieces = []
    for side, name in (("en", "source.spm"), ("de", "target.spm")):
        model = io.BytesIO()
        with open(os.path.join(multi30k, f"train.{side}"), encoding="utf-8") as file:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=file, model_writer=model, vocab_size=vocabulary_size // 2,
                unk_id=0, eos_id=1, bos_id=-1, pad_id=-1, minloglevel=2,
            )
        with open(os.path.join(directory, name), "wb") as file:
            file.write(model.getvalue())
        processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
        pieces += [processor.id_to_piece(i) for i in range(2, processor.vocab_size())]
    ordered = ["</s>", "<unk>"] + list(dict.fromkeys(pieces)) + ["<pad>"]
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as file:
        json.dump({piece: i for i, piece in enumerate(ordered)}, file)
    config = transformers.MarianConfig(
        vocab_size=len(ordered), d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, activation_function="swish",
        max_position_embeddings=256, scale_embedding=True, pad_token_id=len(ordered) - 1,
        decoder_start_token_id=len(ordered) - 1, eos_token_id=0, num_beams=4,
    )
    torch.manual_seed(seed)
    transformers.MarianMTModel(config).save_pretrained(directory)
    return len(ordered)


def command(*arguments):
    """Runs `keras-transformer ...`, echoing and returning its output."""
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", *arguments], capture_output=True, text=True, check=False
    )
    if result.returncode:
        raise RuntimeError(f"keras-transformer {arguments[0]} failed:\n{result.stderr[-3000:]}")
    print(result.stdout, end="", flush=True)
    return result.stdout, time.time() - started


def bleu_of(output):
    return float(output.split("BLEU = ")[1].split()[0]) if "BLEU = " in output else float(output.split("BLEU ")[1].split()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k", required=True, help="the folder of train.{en,de} and val.{en,de}")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--work", help="where the model directories go (default: a temporary folder)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    val = [os.path.join(args.multi30k, f"val.{side}") for side in ("en", "de")]
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or temporary
        ids = marian_layout(os.path.join(work, "marian"), args.multi30k, args.vocabulary_size)
        command("convert", os.path.join(work, "marian"), "--output", os.path.join(work, "converted"))
        greedy = ["--beam-size", "1"]
        before, _ = command("evaluate", "--model-dir", os.path.join(work, "converted"), *greedy,
                            "--source", val[0], "--reference", val[1])
        log, seconds = command(
            "train", "--init-from", os.path.join(work, "converted"), "--model-dir", os.path.join(work, "tuned"),
            "--train-source", os.path.join(args.multi30k, "train.en"), "--train-target", os.path.join(args.multi30k, "train.de"),
            "--valid-source", *val[:1], "--valid-target", *val[1:], "--train-steps", str(args.steps),
            "--checkpoint-every", str(args.steps // 2), "--average", "1", "--warmup-steps", str(args.steps // 4),
            "--buckets", "4", "--valid-bleu-sentences", "0", "--log-every", str(args.steps // 6),
        )
        after, _ = command("evaluate", "--model-dir", os.path.join(work, "tuned"), *greedy,
                           "--source", val[0], "--reference", val[1])
    figures = {
        "ids": ids, "steps": args.steps, "train_seconds": round(seconds),
        "valid_loss_before": float(log.split("valid loss before fine-tuning: ")[1].split()[0]),
        "valid_loss_after": float(log.rsplit("valid loss ", 1)[1].split()[0]),
        "valid_greedy_bleu_before": bleu_of(before), "valid_greedy_bleu_after": bleu_of(after),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=2)


if __name__ == "__main__":
    main()
