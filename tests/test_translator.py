"""Translator: text in, text out (keras_transformer/decoding/translator.py)."""

import warnings

import keras
import numpy as np
import pytest
from conftest import to_numpy
from translation_fixtures import SENTENCES
from translation_fixtures import model  # noqa: F401 (a fixture)
from translation_fixtures import tokenizer  # noqa: F401 (a fixture)
from translation_fixtures import end_positions
from translation_fixtures import source_batch

from keras_transformer.data import SubwordTokenizer
from keras_transformer.data import builtin_corpus
from keras_transformer.decoding import Translator
from keras_transformer.decoding import beam_search
from keras_transformer.decoding import cached_step_function
from keras_transformer.decoding import greedy_search


def test_a_batch_translates_as_its_sentences_one_by_one(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=3, batch_size=4, max_extra_length=6)
    together = translator.n_best(SENTENCES)
    assert len(end_positions(translator)) > 2  # the premise: outputs end at different steps
    # Alone: an empty one, the shortest and the two longest (each alone is
    # one more shape to compile under XLA).
    for sentence, hypotheses in [(SENTENCES[i], together[i]) for i in (2, 4, 6, 7)]:
        alone = translator.n_best([sentence])[0]
        assert [t for t, _ in alone] == [t for t, _ in hypotheses]
        np.testing.assert_allclose([s for _, s in alone], [s for _, s in hypotheses], atol=1e-4)


def test_beam_size_one_without_length_penalty_is_greedy_on_the_model(model, tokenizer):
    source_ids = source_batch(tokenizer, [s for s in SENTENCES if s.strip()])
    bos = keras.ops.full((len(source_ids),), tokenizer.bos_id, dtype="int32")
    results = []
    for search, arguments in ((greedy_search, {}), (beam_search, {"beam_size": 1, "alpha": 0.0})):
        step_fn, state = cached_step_function(model, source_ids, max_length=12)
        ids, scores = search(step_fn, bos, state, max_length=12, eos_id=tokenizer.eos_id, **arguments)
        results.append((to_numpy(ids).reshape(len(source_ids), -1), to_numpy(scores).reshape(-1)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-5)


def test_greedy_translator_equals_argmax_over_full_recomputation(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=1, max_extra_length=6)
    found = translator.search(SENTENCES)
    source_ids = source_batch(tokenizer, [SENTENCES[i] for i in found])
    limits = [len(source) - 1 + 6 for source, _, _ in found.values()]
    # Recompute the whole model on every prefix, without a cache. The
    # prefixes sit in a zero-padded buffer of one shape (target padding does
    # not change earlier positions), so compiled backends compile once
    # (`predict_on_batch`: under JAX, op-by-op calls took minutes in CI).
    targets = np.zeros((len(found), max(limits) + 1), "int32")
    targets[:, 0] = tokenizer.bos_id
    done = np.zeros(len(found), bool)
    for step in range(max(limits)):
        logits = to_numpy(model.predict_on_batch({"source_ids": source_ids, "target_ids": targets}))
        tokens = np.argmax(logits[:, step], axis=-1)
        writing = ~done & (step < np.array(limits))
        targets[writing, step + 1] = tokens[writing]
        done |= writing & (tokens == tokenizer.eos_id)
    for row, (_, ids, _) in enumerate(found.values()):
        np.testing.assert_array_equal(ids[0, : max(limits)], targets[row, 1:])


def test_empty_blank_and_unknown_characters_are_translated_not_fatal(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=4)
    texts = ["", " \t ", "日本語 😀 ∑", "the man ."]
    translations = translator.translate(texts)
    assert len(translations) == 4 and all(isinstance(t, str) for t in translations)
    assert translations[:2] == ["", ""]
    assert translator.n_best([""]) == [[("", 0.0)]]


def test_over_long_lines_are_truncated_with_a_warning(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=4, max_source_length=12)
    long_line = " ".join(["the old man sees the dog ."] * 6)
    with pytest.warns(UserWarning, match=r"Line 2 \(texts\[1\]\) has \d+ subword tokens, more than max_source_length=12"):
        translations = translator.translate(["the man .", long_line])
    truncated = tokenizer.detokenize(tokenizer.tokenize(long_line)[:11])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert translator.translate([truncated]) == translations[1:]


def test_bad_inputs_get_clear_errors(model, tokenizer):
    translator = Translator(model, tokenizer)
    with pytest.raises(TypeError, match="takes a list of strings. Received a single str"):
        translator.translate("the man .")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a string. Received: int 5"):
        translator.translate(["the man .", 5])
    with pytest.raises(ValueError, match=r"texts\[0\] is not valid UTF-8"):
        translator.translate([b"\xff\xfe"])
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1. Received: beam_size=0"):
        Translator(model, tokenizer, beam_size=0)
    for alpha in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"alpha must be a finite number >= 0. Received: alpha={alpha}"):
            Translator(model, tokenizer, alpha=alpha)
    small = SubwordTokenizer.train(builtin_corpus("train", size=100, seed=1), 350)
    with pytest.raises(ValueError, match="disagree on the vocabulary"):
        Translator(model, small)
    with pytest.raises(FileNotFoundError, match="No model.keras in"):
        Translator.load("/nonexistent/run")


def test_save_and_load_keep_the_model_vocabulary_and_settings(model, tokenizer, tmp_path):
    translator = Translator(model, tokenizer, beam_size=3, alpha=0.8, max_extra_length=5)
    translator.save(tmp_path)
    loaded = Translator.load(tmp_path)
    assert loaded.get_config() == translator.get_config()
    sentences = [s for s in SENTENCES if s.strip()][:2]
    assert loaded.translate(sentences) == translator.translate(sentences)
    assert Translator.load(tmp_path, beam_size=1).beam_size == 1


def test_a_model_file_replaced_by_another_keras_model_is_one_error(model, tokenizer, tmp_path):
    """translate and export used to print an AttributeError traceback."""
    Translator(model, tokenizer).save(tmp_path)
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="classifier")
    other.save(tmp_path / "model.keras")
    with pytest.raises(ValueError, match=r"model.keras holds a Sequential \('classifier'\), not a keras_transformer Transformer"):
        Translator.load(tmp_path)
    from keras_transformer.cli import main

    for command in (["translate", "--model-dir", str(tmp_path), "--input", "-"], ["export", "--model-dir", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert str(exit_info.value.code).startswith("error: ") and "holds a Sequential" in str(exit_info.value.code)


@pytest.mark.parametrize(("forced", "batch_size"), [(False, 8), (True, 2)], ids=["free", "prefix_and_eos_forced"])
def test_warm_up_compiles_every_shape_so_translating_compiles_nothing(model, tokenizer, forced, batch_size):
    # Forced tokens too: torch's warm-up records with an EOS id of -1, which a forced EOS must not index.
    # A batch of 8 sheds its first half (beam_search.SHED_FROM): the loops of the half left are warmed up too.
    settings = {"force_eos": True, "target_prefix": tokenizer.tokenize_target(["Die"])[0]} if forced else {}
    # Three source buckets, not five: each is a program per row count to compile (or, under torch, to
    # record). The sentences that fit them, an empty and a blank one among them, decode in the buckets
    # 8 and 18, whose programs grow their caches in two and three phases.
    translator = Translator(model, tokenizer, beam_size=2, batch_size=batch_size, max_source_length=18,
                            max_extra_length=20, **settings)
    fitting = [s for s, ids in zip(SENTENCES, tokenizer.tokenize(SENTENCES), strict=True) if len(ids) < 18]
    sentences = sorted(fitting, key=lambda s: not s.strip())  # the two to translate as a batch first
    assert translator.source_lengths == [8, 12, 18] and translator.row_counts() == [1, 2, 4, 8][
        : 2 + 2 * (batch_size == 8)]
    assert [len(s.strip()) > 0 for s in sentences] == [True, True, False, False]  # the premise
    expected = Translator(model, tokenizer, beam_size=2, max_extra_length=20, **settings).n_best(sentences)
    compiled = translator._search
    programs, seconds = translator.warm_up()
    assert programs == 3 * len(translator.row_counts()) and seconds > 0
    traces = compiled.traces
    recorded = compiled.loops and (compiled.loops.count, compiled.loops.eager)
    got = [translator.n_best([sentence])[0] for sentence in sentences] + translator.n_best(sentences[:2])
    wanted_all = expected + expected[:2]
    if batch_size == 8:  # 12 sentences: a batch of 8, one of 4
        got, wanted_all = got + translator.n_best(sentences * 6), wanted_all + expected * 6
    for hypotheses, wanted in zip(got, wanted_all, strict=True):
        assert [t for t, _ in hypotheses] == [t for t, _ in wanted]
    if compiled.loops is None:  # compiled per shape (or once for all, TensorFlow without XLA)
        assert compiled.traces == traces
    else:  # torch: every loop met was recorded by the warm-up, at once, and every record kept
        assert (compiled.loops.count, compiled.loops.eager) == recorded
        assert recorded[0] >= 2 * programs and recorded[1] == 0
        assert compiled.loops.size == 2 * (7 + (batch_size == 8)) * programs
        assert len(compiled.loops._traces) == recorded[0]


def test_search_ids_decodes_id_lists_as_search_decodes_their_strings(model, tokenizer):
    translator = Translator(model, tokenizer, beam_size=2, max_extra_length=6)
    found = translator.search(SENTENCES)
    got = translator.search_ids([source for source, _, _ in found.values()])
    for (ids, scores), (_, wanted_ids, wanted_scores) in zip(got, found.values(), strict=True):
        np.testing.assert_array_equal(ids, wanted_ids)
        np.testing.assert_allclose(scores, wanted_scores, atol=1e-5)
    for bad in ([], [tokenizer.eos_id], [5, 6], [5] * 300 + [tokenizer.eos_id]):
        with pytest.raises(ValueError, match=r"sources\[0\] must hold 2 to max_source_length=256 ids"):
            translator.search_ids([bad])
    with pytest.raises(ValueError, match=r"warm_up rows must be among .*\[1, 2, 4, 8, 16, 32\]. Received: 3"):
        translator.warm_up([3])
