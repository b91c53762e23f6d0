"""Marian (OPUS-MT) translators, converted: the same logits, searches and
tokens as transformers' `MarianMTModel` and `MarianTokenizer`, on every
backend, from tiny random models built offline."""

import os

import keras
import numpy as np
import pytest

from conftest import in_one_pass
from published_fixtures import SEARCH_OPTIONS
from published_fixtures import SENTENCES
from published_fixtures import options_search_as_generate
from published_fixtures import scores_equal_transformers
from published_fixtures import searches_equal_generate
from published_fixtures import marian_directory
from published_fixtures import remove_tensors

torch = pytest.importorskip("torch")

from keras_transformer.convert import ConversionError  # noqa: E402
from keras_transformer.convert import convert  # noqa: E402
from keras_transformer.decoding import Translator  # noqa: E402

MAX_EXTRA_LENGTH = 12


@pytest.fixture(scope="module", params=["shared", "separate"])
def converted(request, tmp_path_factory):
    """A random Marian model (shared or separate vocabularies), transformers'
    tokenizer, and our translator converted from its directory."""
    root = tmp_path_factory.mktemp(f"marian_{request.param}")
    model, tokenizer = marian_directory(root / "hf", separate=request.param == "separate", eos_bias=2.5)
    translator = convert(root / "hf", root / "ours")
    return model, tokenizer, translator, root


def _published_logits(translator, source_ids, target_ids):
    """Our logits at the published ids' columns."""
    id_map = translator.tokenizer.id_map
    source = np.array([id_map.to_ours(row) for row in source_ids])
    target = np.array([id_map.to_ours(row) for row in target_ids])
    target[:, 0] = translator.tokenizer.bos_id
    logits = keras.ops.convert_to_numpy(translator.model({"source_ids": source, "target_ids": target}))
    return logits[..., id_map.ours_of_published]


def test_scores_of_given_translations_equal_transformers_teacher_forced_log_probabilities(converted):
    model, tokenizer, translator, _ = converted
    scores_equal_transformers(model, tokenizer, translator)


def test_teacher_forced_logits_equal_transformers(converted):
    model, tokenizer, translator, _ = converted
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)
    # Padding in our numbering is id 0: padded positions as Marian pads them.
    source_ids = np.where(batch["attention_mask"] == 1, batch["input_ids"], model.config.pad_token_id)
    target_ids = np.array([[model.config.decoder_start_token_id, 5, 9, 14, 7, 30, 3]] * len(SENTENCES))
    with torch.no_grad():
        theirs = model(
            input_ids=torch.tensor(source_ids), attention_mask=torch.tensor(batch["attention_mask"]),
            decoder_input_ids=torch.tensor(target_ids), use_cache=False,
        ).logits.numpy()
    ours = _published_logits(translator, source_ids, target_ids)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_searches_equal_generate(converted, beam_size):
    """Greedy and beam search give `generate`'s outputs, and so they do
    with each of `SEARCH_OPTIONS` and `generate`'s same options."""
    model, tokenizer, translator, _ = converted
    plain = _searches_equal_generate(model, tokenizer, translator, beam_size)
    assert _ended(model, plain) >= 2  # they end, not only run to their limit
    changed = options_search_as_generate(model, tokenizer, _with_search(translator, beam_size), MAX_EXTRA_LENGTH, plain)
    assert changed == {name for name, _ in SEARCH_OPTIONS}


def _searches_equal_generate(model, tokenizer, translator, beam_size, **generate):
    """Asserts that our search gives `generate`'s best ids (and score) for
    each sentence, with `generate`'s other arguments; returns transformers'
    outputs."""
    return searches_equal_generate(model, tokenizer, _with_search(translator, beam_size), MAX_EXTRA_LENGTH, **generate)


def _with_search(translator, beam_size):
    """`translator` with `beam_size`, searching as `generate` does."""
    return translator.with_search(beam_size=beam_size, alpha=1.0, length_penalty="power", max_extra_length=MAX_EXTRA_LENGTH)


def _ended(model, generated):
    return sum(theirs[-1] == model.config.eos_token_id for theirs in generated)


def test_forced_eos_and_a_forced_first_token_search_as_transformers(tmp_path):
    """A config's `forced_eos_token_id` ends every output at its limit, as
    `generate` does; a target prefix of one token is `generate`'s
    `forced_bos_token_id`."""
    model, tokenizer = marian_directory(tmp_path / "hf", layers=1, forced_eos=True)
    translator = convert(tmp_path / "hf", tmp_path / "ours")
    assert translator.force_eos and Translator.load(tmp_path / "ours").force_eos
    for beam_size in (1, 4):
        _searches_equal_generate(model, tokenizer, translator, beam_size)
    found = Translator(translator.model, translator.tokenizer, beam_size=1, max_extra_length=MAX_EXTRA_LENGTH,
                       force_eos=True).search(SENTENCES)
    # The last token each output may have, where it has one.
    last = [ids[0][len(source) - 2 + MAX_EXTRA_LENGTH] for source, ids, _ in found.values()]
    ends = [token for token in last if token]
    assert ends and set(ends) == {translator.tokenizer.eos_id}  # some ran to the limit, and end there with EOS
    first = 5  # a published id, forced after decoding's start
    prefixed = translator.with_search(target_prefix=translator.tokenizer.id_map.to_ours([first]))
    for beam_size in (1, 4):
        _searches_equal_generate(model, tokenizer, prefixed, beam_size, forced_bos_token_id=first)
    assert all(ids[0][0] == prefixed.target_prefix[0] for _, ids, _ in prefixed.search(SENTENCES).values())


def test_a_sharded_checkpoint_converts_as_its_single_file_does(tmp_path):
    model, tokenizer = marian_directory(tmp_path / "hf", layers=1)
    whole = convert(tmp_path / "hf", tmp_path / "whole")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="60KB")
    tokenizer.save_pretrained(tmp_path / "sharded")
    names = sorted(os.listdir(tmp_path / "sharded"))
    parts = [name for name in names if name.startswith("model-") and name.endswith(".safetensors")]
    assert "model.safetensors" not in names and "model.safetensors.index.json" in names and len(parts) > 1
    sharded = convert(tmp_path / "sharded", tmp_path / "from_shards")
    for ours, theirs in zip(whole.model.weights, sharded.model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    os.remove(tmp_path / "sharded" / parts[-1])
    with pytest.raises(ConversionError, match=f"model.safetensors.index.json names the shard {parts[-1]}, which"):
        convert(tmp_path / "sharded", tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")


def test_a_download_fetches_one_weight_format():
    from keras_transformer.convert.checkpoint import download_files

    common = ["config.json", "generation_config.json", "source.spm", "target.spm", "vocab.json", "README.md"]
    assert download_files(common + ["model.safetensors", "pytorch_model.bin", "tf_model.h5", "rust_model.ot"]) == sorted(
        set(common) - {"README.md"} | {"model.safetensors"})
    assert "pytorch_model.bin" in download_files(common + ["pytorch_model.bin", "flax_model.msgpack"])
    sharded = ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
               "pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    fetched = download_files(common + sharded)
    assert [name for name in fetched if "model-" in name] == sharded[1:3]
    assert "model.safetensors.index.json" in fetched


def test_a_checkpoint_without_final_logits_bias_translates_as_transformers(tmp_path):
    """Published files saved without `final_logits_bias` load in
    transformers with a zero bias; converted, they once translated every
    sentence to the empty string."""
    from transformers import MarianMTModel

    _, tokenizer = marian_directory(tmp_path / "hf", layers=1)
    remove_tensors(tmp_path / "hf", "final_logits_bias")
    model = MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    assert not model.final_logits_bias.any()
    translator = convert(tmp_path / "hf", tmp_path / "ours")
    target_ids = [[model.config.decoder_start_token_id, 5, 9, 14, 7]] * len(SENTENCES)
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)
    source_ids = np.where(batch["attention_mask"] == 1, batch["input_ids"], model.config.pad_token_id)
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(source_ids), attention_mask=torch.tensor(batch["attention_mask"]),
                       decoder_input_ids=torch.tensor(target_ids), use_cache=False).logits.numpy()
    np.testing.assert_allclose(_published_logits(translator, source_ids, target_ids), theirs, atol=1e-5, rtol=0)
    for beam_size in (1, 4):
        _searches_equal_generate(model, tokenizer, translator, beam_size)
    assert all(translator.translate(SENTENCES))  # none empty


def test_tokenizer_equals_marian_tokenizer(converted):
    _, tokenizer, translator, _ = converted
    ours = translator.tokenizer
    for sentence in SENTENCES + ["  Two  spaces, €uro signs and ünïcödé.", ">>deu<< The dog sleeps."]:
        published = tokenizer(sentence)["input_ids"]
        assert ours.published_ids(sentence) + [0] == published
        ids = ours.tokenize(sentence)
        assert ours.id_map.to_published(ids) == published[:-1]
    targets = [tokenizer(text_target=sentence)["input_ids"][:-1] for sentence in SENTENCES]
    assert [ours.id_map.to_published(row) for row in ours.tokenize_target(SENTENCES)] == targets
    for row in targets:
        expected = tokenizer.decode(row, skip_special_tokens=True)
        assert ours.detokenize(ours.id_map.to_ours(row)) == expected


@pytest.mark.parametrize("converted", ["separate"], indirect=True)
def test_the_tokenizer_round_trips_and_its_fingerprint_covers_its_files_and_ids(converted, tmp_path):
    from keras_transformer.data.id_map import IdMap
    from keras_transformer.data.marian_tokenizer import MarianTokenizer

    ours = converted[2].tokenizer
    ours.save(tmp_path / "saved")
    loaded = MarianTokenizer.load(tmp_path / "saved")
    assert loaded.fingerprint() == ours.fingerprint() and loaded.tokenize(SENTENCES) == ours.tokenize(SENTENCES)
    special = dict(ours.id_map.special, unknown=5)  # another numbering of the same files
    assert MarianTokenizer(ours.files, IdMap(ours.id_map.size, **special)).fingerprint() != ours.fingerprint()
    shared = {name: content for name, content in ours.files.items() if name != "target_vocab.json"}
    assert MarianTokenizer(shared, ours.id_map).fingerprint() != ours.fingerprint()
    os.remove(tmp_path / "saved" / "target.spm")  # a required file: the same error as every converted tokenizer's
    with pytest.raises(FileNotFoundError, match="No target.spm in .*saved. Expected \\['source.spm', 'target.spm'"):
        MarianTokenizer.load(tmp_path / "saved")


@pytest.mark.parametrize("converted", ["shared"], indirect=True)
def test_saved_translator_loads_exactly(converted):
    _, _, translator, root = converted
    loaded = Translator.load(root / "ours")
    assert (loaded.beam_size, loaded.alpha, loaded.length_penalty) == (4, 1.0, "power")
    assert loaded.languages == ("en", "de")  # MarianTokenizer's source_lang and target_lang
    inputs = {"source_ids": np.array([[5, 9, 14, 3]]), "target_ids": np.array([[2, 7, 30]])}
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded.model(inputs)), keras.ops.convert_to_numpy(translator.model(inputs)))
    assert loaded.translate(SENTENCES) == translator.translate(SENTENCES)
    assert loaded.model.activation == "swish" and loaded.model.output_bias
    loaded.save(root / "again")
    assert Translator.load(root / "again").translate(SENTENCES[:2]) == translator.translate(SENTENCES[:2])


def _edit_config(directory, **changes):
    import json

    path = os.path.join(directory, "config.json")
    with open(path) as file:
        config = json.load(file)
    config.update(changes)
    with open(path, "w") as file:
        json.dump(config, file)


def test_bad_checkpoints_say_what_was_found(tmp_path):
    marian_directory(tmp_path / "hf", layers=1)
    _edit_config(tmp_path / "hf", activation_function="tanh")
    with pytest.raises(ConversionError, match="activation 'tanh'. Supported: "):
        convert(tmp_path / "hf", tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")
    _edit_config(tmp_path / "hf", activation_function="swish", model_type="bart")
    with pytest.raises(ConversionError, match="type 'bart'. Supported: \\['fsmt', 'm2m_100', 'marian'\\]"):
        convert(tmp_path / "hf", tmp_path / "out")
    _edit_config(tmp_path / "hf", model_type="marian", d_model=48)
    with pytest.raises(ConversionError, match="has shape .* expected"):
        convert(tmp_path / "hf", tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")
    assert [name for name in os.listdir(tmp_path) if "converting" in name] == []
    _edit_config(tmp_path / "hf", d_model=32)
    os.remove(tmp_path / "hf" / "vocab.json")
    with pytest.raises(ConversionError, match="no vocab.json"):
        convert(tmp_path / "hf", tmp_path / "out")
    with pytest.raises(ConversionError, match="not a directory"):
        convert(tmp_path / "missing" / "model", tmp_path / "out")


@pytest.mark.parametrize("converted", ["shared"], indirect=True)
@in_one_pass("jax", "the training command's plumbing; each backend's fit is tested in test_training.py")
def test_fine_tuning_a_converted_translator_lowers_the_validation_loss(converted, tmp_path):
    """`train --init-from` on the built-in corpus: the converted model's
    vocabulary and architecture, its loss on validation pairs falls, and the
    saved translator keeps Marian's length penalty."""
    import contextlib
    import io

    from keras_transformer import cli
    from keras_transformer.data.builtin import builtin_corpus

    _, _, translator, root = converted
    for split, size in (("train", 200), ("valid", 40)):
        pairs = list(builtin_corpus(split, size=size))
        for side, suffix in ((0, "en"), (1, "de")):
            (tmp_path / f"{split}.{suffix}").write_text("\n".join(pair[side] for pair in pairs) + "\n")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli.main([
            "train", "--init-from", str(root / "ours"), "--model-dir", str(tmp_path / "run"),
            "--train-source", str(tmp_path / "train.en"), "--train-target", str(tmp_path / "train.de"),
            "--valid-source", str(tmp_path / "valid.en"), "--valid-target", str(tmp_path / "valid.de"),
            "--train-steps", "24", "--checkpoint-every", "24", "--average", "1", "--warmup-steps", "8",
            "--tokens-per-batch", "1024", "--valid-bleu-sentences", "0", "--log-every", "24",
            "--buckets", "2", "--max-tokens", "64",
        ])
    output = printed.getvalue()
    before = float(output.split("valid loss before fine-tuning: ")[1].split()[0])
    after = float(output.split("checkpoint at step 24 | valid loss ")[1].split()[0])
    assert after < before - 0.1, output
    tuned = Translator.load(tmp_path / "run")
    assert tuned.model.vocabulary_size == translator.model.vocabulary_size
    assert (tuned.model.activation, tuned.length_penalty) == ("swish", "power")
    assert tuned.tokenizer.tokenize(SENTENCES) == translator.tokenizer.tokenize(SENTENCES)


@in_one_pass("tensorflow", "the export is a TensorFlow graph under every backend (a TensorFlow process exports for the others)")
def test_the_export_translates_text_as_the_translator_does(converted, tmp_path):
    import tensorflow as tf

    from keras_transformer.export import export_saved_model

    _, _, translator, _ = converted
    texts = SENTENCES + [">>deu<< The dog sleeps.", "", "  Two  spaces, ünïcödé."]
    export_saved_model(translator, tmp_path / "exported")
    serve = tf.saved_model.load(str(tmp_path / "exported")).signatures["serving_default"]
    served = serve(text=tf.constant(texts))
    assert [text.decode() for text in served["translation"].numpy()] == translator.translate(texts)
    scores = [hypotheses[0][1] for hypotheses in translator.n_best(texts)]
    np.testing.assert_allclose(served["score"].numpy(), scores, atol=1e-4)


@in_one_pass("torch", "the command line's plumbing; the conversion itself is tested above in every pass")
def test_the_convert_command_writes_a_translator_or_one_error_line(converted, tmp_path, capsys):
    from keras_transformer import cli

    _, _, translator, root = converted
    cli.main(["convert", str(root / "hf"), "--output", str(tmp_path / "out")])
    assert "parameters; beam 4, alpha 1.0 (power length penalty)" in capsys.readouterr().out
    assert Translator.load(tmp_path / "out").translate(SENTENCES[:2]) == translator.translate(SENTENCES[:2])
    with pytest.raises(SystemExit, match=r"^error: .*out already exists and is not empty"):
        cli.main(["convert", str(root / "hf"), "--output", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"^error: .*nowhere is not a directory"):
        cli.main(["convert", str(tmp_path / "nowhere"), "--output", str(tmp_path / "other")])


def test_convert_reads_the_checkpoint_s_search_and_each_early_stopping_searches_as_generate(converted, tmp_path):
    """`convert` takes `early_stopping` (transformers' default, False, where
    the checkpoint names none) and the repetition and length options of
    `generation_config.json`; with each `early_stopping` of transformers',
    beam 4 gives `generate`'s outputs and scores."""
    import json
    import shutil

    model, tokenizer, translator, root = converted
    assert translator.early_stopping is False
    shutil.copytree(root / "hf", tmp_path / "hf")
    path = tmp_path / "hf" / "generation_config.json"
    generation = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(generation | {"early_stopping": True, "no_repeat_ngram_size": 3, "min_length": 2}))
    settings = convert(tmp_path / "hf", tmp_path / "ours").search_settings
    assert (settings.early_stopping, settings.no_repeat_ngram_size, settings.min_length, settings.repetition_penalty) == (
        True, 3, 2, 1.0)
    for early_stopping in (True, False, "never"):
        _searches_equal_generate(model, tokenizer, translator.with_search(early_stopping=early_stopping), 4)
