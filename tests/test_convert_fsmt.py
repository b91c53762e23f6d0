"""fairseq's translators converted, from transformers' FSMT layout and
from fairseq's own checkpoint: the same logits, searches and tokens as
transformers' `FSMTForConditionalGeneration` and `FSMTTokenizer`, on
every backend, from one tiny random model built offline."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
from conftest import in_one_pass
from conftest import runs_in_this_pass

from fsmt_fixtures import SENTENCES
from fsmt_fixtures import fairseq_directory
from fsmt_fixtures import fsmt_directory
from published_fixtures import scores_equal_transformers
from published_fixtures import options_search_as_generate
from published_fixtures import searches_equal_generate

torch = pytest.importorskip("torch")
pytest.importorskip("sacremoses")

from keras_transformer.convert import ConversionError  # noqa: E402
from keras_transformer.convert import convert  # noqa: E402
from keras_transformer.data.moses_bpe import MosesBpeTokenizer  # noqa: E402
from keras_transformer.data.tokenizers import load_tokenizer  # noqa: E402
from keras_transformer.decoding import Translator  # noqa: E402

# The options are the searches' own code, the same for every model: test_convert_marian.py
# compares them on every backend; here in one pass.
OPTIONS_PASS = "torch"
MAX_EXTRA_LENGTH = 10
EOS = 2  # fairseq's </s>, where decoding also starts
# Text that each step of Moses' normalization and FSMT's special tokens change.
TRICKY = [
    "  “Quoted”，full-width：digits １２３。Next sentence… (ok)  ",
    "Zero\u200bwidth and\ttabs & <tags> [brackets] 'quotes' 50% e-mail",
    "Hello <unk> world </s> again <pad>",
]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The random FSMT model in transformers' layout, and the same weights
    (its decoder's output tied to its input) as fairseq's checkpoint."""
    root = tmp_path_factory.mktemp("fsmt")
    model, tokenizer, codes = fsmt_directory(root / "fsmt")
    tied = fairseq_directory(root / "fairseq", model, codes, root / "fsmt")
    return root, {"fsmt": model, "fairseq": tied}, tokenizer, codes


@pytest.fixture(scope="module", params=["fsmt", "fairseq"])
def converted(request, published):
    """transformers' model of the layout, its tokenizer, our translator
    converted from the layout's directory, and that directory."""
    root, models, tokenizer, _ = published
    output = root / f"ours_{request.param}"
    return models[request.param], tokenizer, convert(root / request.param, output), output


def _published_logits(translator, source_ids, target_ids):
    """Our logits, `[batch, length, our vocabulary]`, from published ids."""
    id_map = translator.tokenizer.id_map
    source = np.array([id_map.to_ours(row) for row in source_ids])
    target = np.array([id_map.to_ours(row) for row in target_ids])
    target[:, 0] = translator.tokenizer.bos_id
    return keras.ops.convert_to_numpy(translator.model({"source_ids": source, "target_ids": target}))


def _assert_logits_equal(model, tokenizer, translator):
    batch = tokenizer(SENTENCES, return_tensors="np", padding=True)
    target_ids = np.array([[EOS, 5, 9, 14, 7, 30, 3, 40]] * len(SENTENCES))
    with torch.no_grad():  # FSMT drops its causal mask when it caches
        theirs = model(
            input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["attention_mask"]),
            decoder_input_ids=torch.tensor(target_ids), use_cache=False,
        ).logits.numpy()
    ours = _published_logits(translator, batch["input_ids"], target_ids)
    id_map = translator.tokenizer.id_map
    np.testing.assert_allclose(ours[..., id_map.ours_of_published[: theirs.shape[-1]]], theirs, atol=1e-5, rtol=0)
    # Our BOS (a copy of </s>) and the rows the target vocabulary lacks
    # (the source's is larger) sit far below every published logit.
    absent = [translator.tokenizer.bos_id] + id_map.to_ours(range(theirs.shape[-1], id_map.size))
    assert len(absent) > 1 and ours[..., absent].max() < theirs.min() - 40


def test_scores_of_given_translations_equal_transformers_teacher_forced_log_probabilities(converted):
    model, tokenizer, translator, _ = converted
    scores_equal_transformers(model, tokenizer, translator, labelled=False)  # FSMT's tokenizer encodes sources only


def test_teacher_forced_logits_equal_transformers(converted):
    model, tokenizer, translator, output = converted
    _assert_logits_equal(model, tokenizer, translator)
    # FSMT's three matrices stay three; fairseq's tied output is one with
    # the target embedding.
    paths = {variable.path for variable in translator.model.weights}
    assert {"source_embedding/embeddings", "target_embedding/embeddings"} <= paths
    assert ("output_projection/embeddings" in paths) == output.name.endswith("fsmt")


def test_position_table_equals_fairseq_sinusoids(published, converted):
    model = published[1]["fsmt"]
    table = keras.ops.convert_to_numpy(converted[2].model.get_layer("position_table").weights[0])
    # Our row k is fairseq's position k + 2 (positions start after padding).
    theirs = model.model.encoder.embed_positions.weight.detach().numpy()[2 : 2 + len(table)]
    np.testing.assert_allclose(table, theirs, atol=2e-7, rtol=0)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_searches_equal_generate(converted, beam_size):
    """Greedy and beam search give transformers' ids and scores, with the
    checkpoint's length penalty, our per-sentence limit and EOS forced
    there (the config's `forced_eos_token_id`), and (in one pass) so they
    do with each of `SEARCH_OPTIONS` and `generate`'s same options."""
    model, tokenizer, _, output = converted
    translator = Translator.load(output, beam_size=beam_size, max_extra_length=MAX_EXTRA_LENGTH)
    ended = 0
    plain = searches_equal_generate(model, tokenizer, translator, MAX_EXTRA_LENGTH, SENTENCES)
    for (source_ids, _, _), theirs in zip(translator.search(SENTENCES).values(), plain):
        assert theirs[-1] == EOS  # forced at the limit, if not before
        ended += len(theirs) < len(source_ids) - 1 + MAX_EXTRA_LENGTH
    assert translator.force_eos  # the config's forced_eos_token_id
    assert ended >= 1 or beam_size > 1  # greedy: searches that end before their limit, not only there
    if runs_in_this_pass(OPTIONS_PASS):
        # Some option changed some outputs (test_convert_marian.py asserts each does there).
        assert options_search_as_generate(model, tokenizer, translator, MAX_EXTRA_LENGTH, plain)


def test_tokenizer_equals_fsmt_tokenizer(converted):
    from transformers import FSMTTokenizer

    _, tokenizer, translator, output = converted
    ours = translator.tokenizer
    for sentence in SENTENCES + TRICKY:
        published = tokenizer(sentence)["input_ids"]
        assert ours.published_ids(sentence) + [EOS] == published, sentence
        assert ours.id_map.to_published(ours.tokenize(sentence)) == published[:-1]
    # FSMT tokenizes only sources; one whose source side is the target
    # vocabulary and language is the oracle of our targets.
    target_side = FSMTTokenizer(
        langs=["de", "de"], src_vocab_file=str(output / "vocab-tgt.json"),
        tgt_vocab_file=str(output / "vocab-tgt.json"), merges_file=str(output / "merges.txt"),
    )
    targets = [target_side(text)["input_ids"][:-1] for text in SENTENCES + TRICKY]
    assert [ours.id_map.to_published(row) for row in ours.tokenize_target(SENTENCES + TRICKY)] == targets
    rows = targets + [[EOS, 0, 5, 3, 7, 1, EOS, 9]]  # special ids are dropped
    for row in rows:
        assert ours.detokenize(ours.id_map.to_ours(row)) == tokenizer.decode(row, skip_special_tokens=True)
    expected = tokenizer.decode(rows[0], skip_special_tokens=True)
    assert ours.detokenize(np.array([ours.id_map.to_ours(rows[0])] * 2)) == [expected] * 2
    # FSMT's do_lower_case lowercases sources before Moses.
    lowercase = FSMTTokenizer.from_pretrained(str(output.parent / "fsmt"), do_lower_case=True)
    lowered = MosesBpeTokenizer(ours.files, ours.id_map, "en", "de", lowercase=True)
    for sentence in SENTENCES + TRICKY:
        assert lowered.published_ids(sentence) + [EOS] == lowercase(sentence)["input_ids"]


def test_saved_translator_loads_exactly(converted):
    _, _, translator, output = converted
    loaded = Translator.load(output)
    expected_beam = 4 if output.name.endswith("fsmt") else 5  # config.json's num_beams; args.beam
    assert (loaded.beam_size, loaded.alpha, loaded.length_penalty) == (expected_beam, 1.0, "power")
    assert loaded.languages == ("en", "de")  # FSMT's langs; fairseq's source_lang and target_lang
    assert isinstance(loaded.tokenizer, MosesBpeTokenizer)
    assert loaded.tokenizer.fingerprint() == translator.tokenizer.fingerprint() == load_tokenizer(output).fingerprint()
    inputs = {"source_ids": np.array([[5, 9, 14, 3]]), "target_ids": np.array([[2, 7, 30]])}
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded.model(inputs)), keras.ops.convert_to_numpy(translator.model(inputs))
    )
    assert (loaded.model.activation, loaded.model.decoder_d_ff) == ("gelu", 48)
    # The searches' own limit, so that their programs are the ones compiled before.
    shorter = Translator.load(output, max_extra_length=MAX_EXTRA_LENGTH)
    converted_translator = Translator(
        translator.model, translator.tokenizer, beam_size=loaded.beam_size, alpha=loaded.alpha,
        length_penalty=loaded.length_penalty, max_extra_length=MAX_EXTRA_LENGTH, force_eos=loaded.force_eos,
    )
    assert loaded.force_eos  # the config's forced_eos_token_id; fairseq's generator's own rule
    assert shorter.translate(SENTENCES) == converted_translator.translate(SENTENCES)


def test_fairseq_configuration_as_cfg(published, tmp_path):
    """fairseq >= 0.10 saves `cfg` (dictionaries), with the search's own
    beam and length penalty, where older checkpoints saved `args`."""
    root, models, tokenizer, codes = published
    fairseq_directory(tmp_path / "fairseq", models["fsmt"], codes, root / "fsmt", args="cfg")
    translator = convert(tmp_path / "fairseq", tmp_path / "ours")
    assert (translator.beam_size, translator.alpha) == (3, 0.8)
    _assert_logits_equal(models["fairseq"], tokenizer, translator)


def _fails_cleanly(source, output, match):
    with pytest.raises(ConversionError, match=match):
        convert(source, output)
    assert not os.path.exists(output)
    assert [name for name in os.listdir(os.path.dirname(output)) if "converting" in name] == []


def _edit_json(path, **changes):
    with open(path) as file:
        config = json.load(file)
    with open(path, "w") as file:
        json.dump(config | changes, file)


def test_bad_checkpoints_say_what_was_found(published, tmp_path):
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    root = published[0]
    fsmt, fairseq, output = tmp_path / "fsmt", tmp_path / "fairseq", str(tmp_path / "out")
    shutil.copytree(root / "fsmt", fsmt)
    shutil.copytree(root / "fairseq", fairseq)
    _edit_json(fsmt / "config.json", model_type="bert")
    _fails_cleanly(fsmt, output, "type 'bert'. Supported: ")
    _edit_json(fsmt / "config.json", model_type="fsmt", activation_function="gelu_new")
    _fails_cleanly(fsmt, output, "activation 'gelu_new'. Supported: ")
    _edit_json(fsmt / "config.json", activation_function="gelu")
    tensors = load_file(fsmt / "model.safetensors")
    tensors["model.encoder.layers.0.fc1.weight"] = np.zeros((80, 32), np.float32)
    save_file(tensors, fsmt / "model.safetensors")
    _fails_cleanly(fsmt, output, r"inner_dense/kernel has shape \(32, 80\); expected \(32, 64\)")
    os.remove(fsmt / "model.safetensors")
    _fails_cleanly(fsmt, output, "has no weights. Expected model.safetensors")

    checkpoint = torch.load(fairseq / "model.pt", weights_only=False)
    for change, match in (
        ({"encoder_normalize_before": True}, r"encoder_normalize_before=True \(pre-LN blocks\) is not supported"),
        ({"activation_fn": "tanh"}, r"activation_fn\) uses the activation 'tanh'. Supported: \['gelu', 'relu', 'silu', 'swish'\]"),
    ):
        edited = dict(checkpoint, args=type(checkpoint["args"])(**(vars(checkpoint["args"]) | change)))
        torch.save(edited, fairseq / "model.pt")
        _fails_cleanly(fairseq, output, match)
    torch.save(checkpoint, fairseq / "model.pt")
    os.remove(fairseq / "dict.de.txt")
    _fails_cleanly(fairseq, output, r"No dict.de.txt beside model.pt.*found \['dict.en.txt'\]")


@in_one_pass("tensorflow", "the tokenizer's check, before any export; the export is a TensorFlow graph under every backend")
def test_export_says_moses_has_no_graph_op(converted, tmp_path):
    from keras_transformer.export import export_saved_model

    _, _, _, output = converted
    with pytest.raises(ValueError, match="MosesBpeTokenizer has no TensorFlow op"):
        export_saved_model(Translator.load(output), tmp_path / "exported")
    assert not os.path.exists(tmp_path / "exported")
