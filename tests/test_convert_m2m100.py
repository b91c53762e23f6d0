"""M2M-100 and NLLB-200 converted: the same logits, searches (the target
language forced first) and tokens as transformers'
`M2M100ForConditionalGeneration`, `M2M100Tokenizer` and `NllbTokenizer`,
on every backend, from tiny random models built offline."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
from conftest import in_one_pass
from conftest import runs_in_this_pass

from m2m100_fixtures import EOS
from m2m100_fixtures import m2m100_directory
from published_fixtures import SENTENCES
from published_fixtures import scores_equal_transformers
from published_fixtures import options_search_as_generate
from published_fixtures import searches_equal_generate

torch = pytest.importorskip("torch")

from keras_transformer.convert import ConversionError  # noqa: E402
from keras_transformer.convert import convert  # noqa: E402
from keras_transformer.decoding import Translator  # noqa: E402

# The options are the searches' own code, the same for every model: test_convert_marian.py
# compares them on every backend; here in one pass.
OPTIONS_PASS = "torch"
MAX_EXTRA_LENGTH = 10
# Each kind's pair at conversion, and another of its pairs.
PAIRS = {"m2m100": (("en", "de"), ("de", "ru")), "nllb": (("eng_Latn", "deu_Latn"), ("deu_Latn", "fra_Latn"))}


@pytest.fixture(scope="module", params=["m2m100", "nllb"])
def converted(request, tmp_path_factory):
    """transformers' model and tokenizer, and our translator converted
    from their directory, for `(source, target) = PAIRS[kind][0]`."""
    root = tmp_path_factory.mktemp(request.param)
    model, tokenizer = m2m100_directory(root / "published", request.param)
    (source, target), _ = PAIRS[request.param]
    translator = convert(root / "published", root / "ours", source_language=source, target_language=target)
    return request.param, model, tokenizer, translator, root


def _their_ids(tokenizer, source, target, texts, side="source"):
    tokenizer.src_lang, tokenizer.tgt_lang = source, target
    if side == "source":
        return [tokenizer(text).input_ids for text in texts]
    return [tokenizer(text_target=text).input_ids for text in texts]


def test_scores_of_given_translations_equal_transformers_teacher_forced_log_probabilities(converted):
    kind, model, tokenizer, translator, _ = converted
    (source, target), _ = PAIRS[kind]
    tokenizer.src_lang, tokenizer.tgt_lang = source, target
    scores_equal_transformers(model, tokenizer, translator)


def test_teacher_forced_logits_equal_transformers(converted):
    kind, model, tokenizer, translator, _ = converted
    (source, target), _ = PAIRS[kind]
    tokenizer.src_lang, tokenizer.tgt_lang = source, target
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)
    language = tokenizer.convert_tokens_to_ids(translator.tokenizer.languages[target])
    target_ids = np.array([[EOS, language, 9, 14, 7, 30, 3, 40]] * len(SENTENCES))
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["attention_mask"]),
                       decoder_input_ids=torch.tensor(target_ids)).logits.numpy()
    id_map = translator.tokenizer.id_map
    ours_source = np.array([id_map.to_ours(row) for row in batch["input_ids"]])
    ours_target = np.array([id_map.to_ours(row) for row in target_ids])
    ours_target[:, 0] = translator.tokenizer.bos_id
    ours = keras.ops.convert_to_numpy(translator.model({"source_ids": ours_source, "target_ids": ours_target}))
    np.testing.assert_allclose(ours[..., id_map.ours_of_published], theirs, atol=1e-5, rtol=0)
    # Pre-LN blocks with a norm after each stack, one matrix for everything.
    paths = {variable.path for variable in translator.model.weights}
    assert {"encoder_norm/gamma", "decoder_norm/gamma", "token_embedding/embeddings"} <= paths


@pytest.mark.parametrize("beam_size", [1, 4])
def test_searches_equal_generate_with_the_target_language_forced(converted, beam_size):
    """With the target language forced first, greedy and beam search give
    `generate`'s outputs, also (in one pass) with each of `SEARCH_OPTIONS`."""
    kind, model, tokenizer, _, root = converted
    loaded = Translator.load(root / "ours", beam_size=beam_size, max_extra_length=MAX_EXTRA_LENGTH)
    changed = set()  # the options that changed some output, of some pair
    for source, target in PAIRS[kind]:
        translator = loaded.with_languages(source, target)
        tokenizer.src_lang, tokenizer.tgt_lang = source, target
        language = tokenizer.convert_tokens_to_ids(translator.tokenizer.languages[target])
        generated = searches_equal_generate(model, tokenizer, translator, MAX_EXTRA_LENGTH, forced_bos_token_id=language)
        assert all(theirs[0] == language for theirs in generated)
        ended = sum(EOS in theirs for theirs in generated)
        assert ended >= 1 or beam_size > 1  # greedy: searches that end before their limit, not only there
        if runs_in_this_pass(OPTIONS_PASS):
            changed |= options_search_as_generate(
                model, tokenizer, translator, MAX_EXTRA_LENGTH, generated, forced_bos_token_id=language)
    # Some option changed some outputs (test_convert_marian.py asserts each does there).
    assert changed or not runs_in_this_pass(OPTIONS_PASS)


def test_tokenizer_ids_equal_transformers_for_each_language(converted):
    kind, _, tokenizer, translator, root = converted
    ours = Translator.load(root / "ours").tokenizer
    texts = SENTENCES + ["  Two  spaces, a tab\tand “quotes” ١٢٣ ", "Zero\u200bwidth é ß"]
    for source, target in PAIRS[kind]:
        pair = ours.with_languages(source, target)
        for side, tokenize in (("source", pair.tokenize), ("target", pair.tokenize_target)):
            theirs = _their_ids(tokenizer, source, target, texts, side)
            assert [pair.id_map.to_ours(row[:-1]) for row in theirs] == tokenize(texts), f"{source}-{target} {side}"
    # Detokenizing drops the language token and EOS (transformers' M2M100Tokenizer
    # keeps its language tokens, which it does not count as special).
    ids = _their_ids(tokenizer, *PAIRS[kind][0], SENTENCES, "target")
    theirs = tokenizer.batch_decode([row[1:] for row in ids], skip_special_tokens=True)
    assert ours.detokenize([ours.id_map.to_ours(row) for row in ids]) == theirs == [text.strip() for text in SENTENCES]


def test_saved_translator_loads_exactly_with_its_pair(converted):
    kind, _, _, translator, root = converted
    loaded = Translator.load(root / "ours")
    assert loaded.languages == PAIRS[kind][0] and loaded.target_prefix == translator.target_prefix
    assert loaded.translate(SENTENCES) == translator.translate(SENTENCES)
    for ours, theirs in zip(loaded.model.weights, translator.model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    other = loaded.with_languages(*PAIRS[kind][1])
    assert other.languages == PAIRS[kind][1] and other.target_prefix != loaded.target_prefix


def test_unknown_codes_a_moe_checkpoint_and_a_bad_prefix_say_what_was_found(converted, tmp_path):
    kind, _, _, translator, root = converted
    wrong = "deu_Latm" if kind == "nllb" else "dee"
    with pytest.raises(ValueError, match=rf"target language must be one of the model's .*nearest: .*{PAIRS[kind][0][1]}.*{wrong}"):
        translator.with_languages(target_language=wrong)
    with pytest.raises(ConversionError, match=rf"nearest.*Received: '{wrong}'"):
        convert(root / "published", tmp_path / "bad", source_language=PAIRS[kind][0][0], target_language=wrong)
    assert not os.path.exists(tmp_path / "bad")
    unnamed = tmp_path / "unnamed"  # a checkpoint whose tokenizer names no target language
    shutil.copytree(root / "published", unnamed)
    settings = json.loads((unnamed / "tokenizer_config.json").read_text())
    (unnamed / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in settings.items() if k != "tgt_lang"}))
    with pytest.raises(ConversionError, match=r"No target language was given, .* names none \(tgt_lang\)\. "
                       r"Expected one of the model's \d+ codes, .*: convert's --target-language CODE"):
        convert(unnamed, tmp_path / "unnamed_out", source_language=PAIRS[kind][0][0])
    with pytest.raises(ValueError, match=r"target_prefix must be .* ids in \[1, \d+\)"):
        translator.with_search(target_prefix=[translator.model.vocabulary_size + 5])
    moe = tmp_path / "moe"
    moe.mkdir()
    config = json.loads((root / "published" / "config.json").read_text()) | {"model_type": "nllb-moe"}
    (moe / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="'nllb-moe': NLLB-MoE .* mixtures of experts"):
        convert(moe, tmp_path / "moe_out")



@in_one_pass("tensorflow", "the export is a TensorFlow graph under every backend (a TensorFlow process exports for the others)")
def test_the_export_takes_each_text_s_languages_and_translates_as_the_translator_does(converted, tmp_path):
    import tensorflow as tf

    from keras_transformer.export import export_saved_model

    kind, _, _, translator, _ = converted
    (source, target), (other_source, other_target) = PAIRS[kind]
    texts = SENTENCES + ["", "  Two  spaces, ünïcödé. "]
    export_saved_model(translator, tmp_path / "exported")
    serve = tf.saved_model.load(str(tmp_path / "exported")).signatures["serving_default"]
    for pair, codes in (((source, target), ("", "")), ((source, target), (source, target)),
                        ((other_source, other_target), (other_source, other_target))):
        served = serve(text=tf.constant(texts), source_language=tf.constant([codes[0]] * len(texts)),
                       target_language=tf.constant([codes[1]] * len(texts)))
        # The converted pair is the translator's own: its searches, compiled already.
        ours = translator if pair == translator.languages else translator.with_languages(*pair)
        assert [text.decode() for text in served["translation"].numpy()] == ours.translate(texts), pair
        np.testing.assert_allclose(served["score"].numpy(), [h[0][1] for h in ours.n_best(texts)], atol=1e-4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown language code"):
        serve(text=tf.constant(["A dog."]), source_language=tf.constant([source]), target_language=tf.constant(["xx_Yyyy"]))


@in_one_pass("torch", "the command line's plumbing; each backend's search of another pair is tested above")
def test_translate_takes_another_pair_and_convert_an_unknown_code_in_one_error_line(converted, tmp_path):
    from keras_transformer import cli

    kind, _, _, translator, root = converted
    (source, target), (other_source, other_target) = PAIRS[kind]
    (tmp_path / "input.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    cli.main(["translate", "--model-dir", str(root / "ours"), "--input", str(tmp_path / "input.txt"), "--output",
              str(tmp_path / "output.txt"), "--source-language", other_source, "--target-language", other_target])
    expected = translator.with_languages(other_source, other_target).translate(SENTENCES)
    assert (tmp_path / "output.txt").read_text(encoding="utf-8").split("\n")[:-1] == expected != translator.translate(SENTENCES)
    with pytest.raises(SystemExit, match=r"^error: .*The source language must be one of the model's .*Received: 'zz'"):
        cli.main(["convert", str(root / "published"), "--output", str(tmp_path / "bad"), "--source-language", "zz",
                  "--target-language", target])
    assert not os.path.exists(tmp_path / "bad")
