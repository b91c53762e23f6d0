"""The TF Serving export: text in, translations out, from any backend."""

import base64
import json
import os
import re
import runpy
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import to_numpy, in_one_pass

from translation_fixtures import SENTENCES

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer.data import builtin_corpus
from keras_transformer.data import make_dataset
from keras_transformer.export import export_new_version
from keras_transformer.export import export_saved_model
from keras_transformer.export.saved_model import request_budget

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {"beam_size": 3, "alpha": 0.6, "max_extra_length": 6, "max_source_length": 24}

# The exported translator cuts rows at max_source_length=24 on purpose, and
# the translator it is compared with warns about each cut row.
pytestmark = pytest.mark.filterwarnings("ignore:Line .* subword tokens, more than max_source_length")


@pytest.fixture(scope="module")
def translator(translation_model, translation_tokenizer):
    """The decoding tests' tiny model (translation_fixtures.py), whose
    outputs end at different steps."""
    return kt.Translator(translation_model, translation_tokenizer, **SETTINGS)


@pytest.fixture
def tokenizer(translation_tokenizer):
    return translation_tokenizer


# Room for 8 full rows of max_source_length=24 tokens.
MAX_REQUEST_TOKENS = 240  # 8 full rows: 8 x (24 + 6)


@pytest.fixture(scope="module")
def exported(translator, tmp_path_factory):
    return export_saved_model(translator, tmp_path_factory.mktemp("export") / "1", MAX_REQUEST_TOKENS)


@pytest.fixture(scope="module")
def served(exported):
    return tf.saved_model.load(exported)


def serve(served, texts):
    outputs = served.signatures["serving_default"](text=tf.constant(texts, tf.string))
    translations = [t.decode("utf-8") for t in outputs["translation"].numpy().tolist()]
    return translations, outputs["score"].numpy()


@in_one_pass("tensorflow", "a SavedModel in a process without the package; each backend's export is the test below")
def test_a_fresh_tensorflow_process_serves_what_the_translator_translates(
    exported, translator, tmp_path
):
    texts = SENTENCES + ["the dog sees the old man and the cat ."]
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps([base64.b64encode(t.encode()).decode() for t in texts]))
    outputs = tmp_path / "outputs.json"
    subprocess.run(
        [sys.executable, os.path.join(HERE, "serve_saved_model.py"), str(exported), str(inputs), str(outputs)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    served = json.loads(outputs.read_text())
    assert served["modules"] == []  # keras_transformer was not imported
    expected = translator.n_best(texts)
    assert len({t for t, _ in (h[0] for h in expected)}) > 4  # varied outputs, some empty
    for loading in ("eager", "session"):
        assert served[loading]["translation"] == [h[0][0] for h in expected]
        np.testing.assert_allclose(served[loading]["score"], [h[0][1] for h in expected], atol=1e-4)


@in_one_pass("jax", "the SavedModel's signatures are TensorFlow's")
def test_saved_model_cli_lists_both_signatures_with_dtypes_and_shapes(exported):
    shown = subprocess.run(
        [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli", "show", "--all", "--dir", str(exported)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    signatures = {}
    for name, body in re.findall(r"signature_def\['(\w+)'\]:\n(.*?)Method name is", shown, re.S):
        inputs, outputs = body.split("contains the following output(s):")
        tensors = r"(\w+)\['(\w+)'\] tensor_info:\s+dtype: (\w+)\s+shape: (\([-\d, ]*\))"
        signatures[name] = {
            (kind, key): (dtype, shape) for kind, key, dtype, shape in re.findall(tensors, inputs + outputs)
        }
    assert signatures["serving_default"] == {
        ("inputs", "text"): ("DT_STRING", "(-1)"),
        ("outputs", "translation"): ("DT_STRING", "(-1)"),
        ("outputs", "score"): ("DT_FLOAT", "(-1)"),
    }
    assert signatures["translate_ids"] == {
        ("inputs", "source_ids"): ("DT_INT32", "(-1, -1)"),
        ("outputs", "target_ids"): ("DT_INT32", "(-1, -1)"),
        ("outputs", "score"): ("DT_FLOAT", "(-1)"),
    }


def test_the_folder_is_self_contained_with_the_vocabulary_as_an_asset(
    exported, translator, tmp_path
):
    assets = os.path.join(exported, "assets")
    with open(os.path.join(assets, "subword.model"), "rb") as file:
        assert file.read() == translator.tokenizer.proto
    with open(os.path.join(assets, "translator.json")) as file:
        settings = json.load(file)
    assert {k: settings[k] for k in SETTINGS} == SETTINGS
    assert settings["eos_id"] == translator.tokenizer.eos_id
    # A copy elsewhere serves alone: nothing points back to the export's
    # source files.
    copy = tmp_path / "moved"
    subprocess.run(["cp", "-r", str(exported), str(copy)], check=True)
    translations, _ = serve(tf.saved_model.load(str(copy)), SENTENCES[:2])
    assert translations == translator.translate(SENTENCES[:2])


def test_the_ids_signature_returns_the_searched_ids(served, translator, tokenizer):
    sentences = [s for s in SENTENCES if s.strip()]
    rows = tokenizer.tokenize(sentences)
    source_ids = np.zeros((len(rows) + 1, max(map(len, rows))), "int32")  # and one empty row
    for i, ids in enumerate(rows):
        source_ids[i, : len(ids)] = ids
    outputs = served.signatures["translate_ids"](source_ids=tf.constant(source_ids))
    target_ids = outputs["target_ids"].numpy()
    found = translator.search(sentences)
    for i, (_, ids, scores) in found.items():
        best = list(ids[0])
        best = best[: best.index(tokenizer.eos_id)] if tokenizer.eos_id in best else best
        best = [t for t in best if t != 0]
        assert list(target_ids[i][: len(best)]) == best and not target_ids[i][len(best) :].any()
        np.testing.assert_allclose(outputs["score"].numpy()[i], scores[0], atol=1e-4)
    assert not target_ids[-1].any() and outputs["score"].numpy()[-1] == 0.0

    with pytest.raises(tf.errors.InvalidArgumentError, match="vocabulary size 400"):
        served.signatures["translate_ids"](source_ids=tf.constant([[5, 400, 6]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be >= 0"):
        served.signatures["translate_ids"](source_ids=tf.constant([[5, -1, 6]]))


def test_bad_rows_get_per_row_results(served, translator):
    sentence = SENTENCES[0]
    long_line = " ".join([SENTENCES[3]] * 40)  # far more than max_source_length tokens
    # Not UTF-8: a lone byte, and a three-byte character cut after two.
    not_utf8 = [b"the \xff dog .", b"the \xe2\x82 cat ."]
    texts = [b"", b"  \t ", sentence.encode(), long_line.encode(), *not_utf8, "😀 と".encode()]
    translations, scores = serve(served, tf.constant(texts))
    assert translations[:2] == ["", ""] and list(scores[:2]) == [0.0, 0.0]
    with pytest.warns(UserWarning, match="max_source_length=24"):
        expected = translator.n_best(
            [sentence, long_line, *(t.decode("utf-8", "replace") for t in not_utf8), "😀 と"]
        )
    assert translations[2:] == [h[0][0] for h in expected]
    np.testing.assert_allclose(scores[2:], [h[0][1] for h in expected], atol=1e-4)
    # Each row as it is alone: the bad rows do not change the good one.
    assert serve(served, [sentence])[0] == [translations[2]]

    translations, scores = serve(served, tf.constant([], tf.string))
    assert translations == [] and scores.shape == (0,)


@in_one_pass("tensorflow", "the export's graph bounds a request whatever backend trained the model")
def test_a_request_costs_at_most_its_bounds(exported, served, translator):
    with open(os.path.join(exported, "assets", "translator.json")) as file:
        settings = json.load(file)
    assert settings["max_request_tokens"] == MAX_REQUEST_TOKENS
    assert settings["max_source_bytes"] >= 2 * 24
    long_line = " ".join([SENTENCES[3]] * 40)
    # A 10 MB string is cut before it is tokenized: it costs what a line of
    # max_source_bytes costs, and translates as the line does.
    huge = (long_line + " ") * (10 * 2**20 // (len(long_line) + 1))
    assert serve(served, [huge])[0] == serve(served, [long_line])[0]
    # Texts x (longest + max_extra_length): 8 full rows fit and a ninth is
    # refused, saying why, through both signatures.
    assert len(serve(served, [long_line] * 8)[0]) == 8
    message = (
        r"costs more than this export decodes at once: max_request_tokens=240, counted as texts x "
        r"\(tokens of the longest text with EOS, up to max_source_length=24, \+ max_extra_length=6\)"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        serve(served, [long_line] * 9)
    ids = tf.ragged.constant(translator.tokenizer.tokenize([long_line] * 9), tf.int32).to_tensor()
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        served.signatures["translate_ids"](source_ids=ids)
    # Short rows cost less each, but not nothing: each decodes up to its
    # length + max_extra_length, so many one-token texts are refused too.
    short = SENTENCES[4]
    cost = len(translator.tokenizer.tokenize(short)) + 1 + 6
    assert len(serve(served, [short] * (MAX_REQUEST_TOKENS // cost))[0]) == MAX_REQUEST_TOKENS // cost
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        serve(served, [short] * (MAX_REQUEST_TOKENS // cost + 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="costs more than|holds more texts"):
        serve(served, ["a"] * 4096)
    # One long text makes every row of its batch run as long: 1 long and 7
    # short ones cost 8 full rows, 1 and 8 are refused.
    assert len(serve(served, [long_line] + [short] * 7)[0]) == 8
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        serve(served, [long_line] + [short] * 8)
    assert request_budget(translator) == 32 * (24 + 6)  # the default
    # The bound on the texts of a request is tested on the export command's SavedModel (below).
    with pytest.raises(ValueError, match="max_request_rows must be an integer >= 1. Received: max_request_rows=0"):
        export_saved_model(translator, os.path.join(os.path.dirname(exported), "3"), max_request_rows=0)
    with pytest.raises(ValueError, match=r"max_request_tokens must be an integer >= max_source_length \+ max_extra_length = 24 \+ 6 = 30, so that one full row fits. Received: max_request_tokens=29"):
        export_saved_model(translator, os.path.join(os.path.dirname(exported), "2"), 29)


def test_a_predict_request_round_trips_through_the_signature(served, translator):
    from tensorflow_serving.apis import predict_pb2

    texts = [s for s in SENTENCES if s.strip()][:4]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "translator"
    request.model_spec.signature_name = "serving_default"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(texts))
    # What the server receives: the request's bytes on the wire.
    received = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    signature = served.signatures[received.model_spec.signature_name]
    inputs = {name: tf.make_ndarray(proto) for name, proto in received.inputs.items()}
    response = predict_pb2.PredictResponse()
    response.model_spec.CopyFrom(received.model_spec)
    for name, value in signature(**{k: tf.constant(v) for k, v in inputs.items()}).items():
        response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
    answered = predict_pb2.PredictResponse.FromString(response.SerializeToString())
    translations = [t.decode("utf-8") for t in tf.make_ndarray(answered.outputs["translation"])]
    assert translations == translator.translate(texts)
    assert tf.make_ndarray(answered.outputs["score"]).dtype == np.float32


def trained_for_a_few_steps(tokenizer, **options):
    """A tiny model after 4 optimizer steps under the current backend, on
    batches of one length (one program to compile under JAX)."""
    model = kt.build_transformer("tiny", vocabulary_size=tokenizer.vocabulary_size, **options)
    kt.training.compile_model(model, warmup_steps=4)
    batches = make_dataset(
        builtin_corpus("train", size=64, seed=1), tokenizer, 512, repeat=True, seed=1,
        max_length=options.get("max_length", 256), buckets=1,
    )  # fmt: skip
    model.fit(batches, steps_per_epoch=4, epochs=1, verbose=0, shuffle=False)
    return model


# Table 3's variations export too: d_k != d_v, learned positions (which cut
# the sources at their max_length=20, below SETTINGS' 24) and restricted
# self-attention.
TABLE3_OPTIONS = {"key_dim": 8, "value_dim": 24, "position_encoding": "learned", "max_length": 20, "attention_window": 3}


# The variations in the TensorFlow pass only: their weights and graphs are
# the same under every backend, which the default model shows in each pass.
@pytest.mark.parametrize("options", [
    {},
    pytest.param(TABLE3_OPTIONS, marks=in_one_pass("tensorflow", "Table 3's layers' export; each backend's export is the default's")),
], ids=["default", "table3_options"])  # fmt: skip
def test_a_model_trained_under_this_backend_serves_as_tensorflow_translates_it(tokenizer, tmp_path, options):
    model = trained_for_a_few_steps(tokenizer, **options)
    translator = kt.Translator(model, tokenizer, **SETTINGS)
    path = export_saved_model(translator, tmp_path / "export")
    served = tf.saved_model.load(str(path))

    # The SavedModel holds this backend's trained weights, bit for bit.
    exported = {v.name.removesuffix(":0"): v.numpy() for v in served.model_variables}
    for variable in model.weights:
        if variable.path in exported:
            np.testing.assert_array_equal(exported[variable.path], to_numpy(variable))
    assert len(exported) == len([v for v in model.weights if "seed_generator" not in v.path])

    # And serves the TensorFlow backend's translation of those weights.
    texts = [s for s in SENTENCES if s.strip()]
    if keras.backend.backend() == "tensorflow":
        expected = translator.translate(texts)
    else:
        translator.save(tmp_path / "saved")
        (tmp_path / "input.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
        subprocess.run(
            [sys.executable, "-m", "keras_transformer", "translate", "--model-dir", str(tmp_path / "saved"),
             "--input", str(tmp_path / "input.txt"), "--output", str(tmp_path / "output.txt")],
            check=True, capture_output=True, env={**os.environ, "KERAS_BACKEND": "tensorflow"},
        )  # fmt: skip
        expected = (tmp_path / "output.txt").read_text(encoding="utf-8").splitlines()
    assert serve(served, texts)[0] == expected


@in_one_pass("tensorflow", "the command's options; under JAX and torch every export here runs this command in a "
             "TensorFlow process, and each backend's export is tested in every pass")
def test_the_export_command_writes_a_saved_model_that_translates_its_rows_at_most(translator, tmp_path, capsys):
    """The quick tier's run of the command: a greedy translator, exported to
    --output, translates as the translator does, at most --max-request-rows
    texts a request."""
    translator.save(tmp_path / "translator")
    cli.main(["export", "--model-dir", str(tmp_path / "translator"), "--output", str(tmp_path / "export"),
              "--beam-size", "1", "--max-request-tokens", "10000", "--max-request-rows", "3"])
    printed = capsys.readouterr().out
    assert f"Exported a SavedModel to {tmp_path / 'export'}" in printed
    assert "a request may hold 3 texts and cost 10000 tokens" in printed
    served = tf.saved_model.load(str(tmp_path / "export"))
    greedy = kt.Translator(translator.model, translator.tokenizer, **{**SETTINGS, "beam_size": 1})
    assert serve(served, SENTENCES[:2])[0] == greedy.translate(SENTENCES[:2])
    # Every text holds beam x vocabulary scores a step: at most so many texts.
    short = SENTENCES[4]
    assert len(serve(served, [short] * 3 + [""] * 5)[0]) == 8  # empty texts cost nothing
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds more texts than this export decodes at once: max_request_rows=3"):
        serve(served, [short] * 4)


@in_one_pass("tensorflow", "the search's forced tokens in the export's graph, which is TensorFlow's under every backend")
def test_the_export_keeps_the_target_prefix_and_forced_eos(translator, tmp_path):
    prefix = translator.tokenizer.tokenize_target(["Die Frau"])[0]
    forced = kt.Translator(translator.model, translator.tokenizer, **{**SETTINGS, "beam_size": 2},
                           target_prefix=prefix, force_eos=True)
    served = tf.saved_model.load(export_saved_model(forced, tmp_path / "1", MAX_REQUEST_TOKENS))
    texts = SENTENCES[:2] + SENTENCES[3:5]
    expected = forced.translate(texts)
    assert serve(served, texts)[0] == expected
    assert all(text.startswith("Die Frau") for text in expected) and expected != translator.translate(texts)


@in_one_pass("tensorflow", "version folders; each backend's export is tested in every pass")
def test_exports_go_to_new_versions_in_tf_serving_layout(translator, tmp_path, capsys):
    model_dir = tmp_path / "toy"
    translator.save(model_dir)
    base = tmp_path / "saved_models"
    # The command's export (export_new_version's) is the first version, in a folder named after --model-dir.
    cli.main(["export", "--model-dir", str(model_dir), "--base-dir", str(base), "--beam-size", "1"])
    assert f"Exported a SavedModel to {base / 'toy' / '1'} (beam 1," in capsys.readouterr().out
    assert sorted(os.listdir(base)) == ["toy"]
    assert sorted(os.listdir(base / "toy")) == ["1"]
    (base / "toy" / "7").mkdir()
    # What an export killed midway leaves, and the folder of one still running.
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (base / "toy" / f".partial-{int(ended.stdout)}-x1").mkdir()
    (base / "toy" / f".partial-{int(ended.stdout)}-x1" / "saved_model.pb").write_bytes(b"cut short")
    (base / "toy" / f".partial-{os.getpid()}-y2").mkdir()
    assert export_new_version(translator, "toy", base_dir=str(base)) == str(base / "toy" / "8")
    # No partial export of this one, nor of the killed one, is left behind.
    assert sorted(os.listdir(base / "toy")) == [f".partial-{os.getpid()}-y2", "1", "7", "8"]

    greedy = tf.saved_model.load(str(base / "toy" / "1"))
    assert serve(greedy, SENTENCES[:2])[0] == kt.Translator(
        translator.model, translator.tokenizer, **{**SETTINGS, "beam_size": 1}
    ).translate(SENTENCES[:2])

    with pytest.raises(FileExistsError, match="not an empty directory"):
        export_saved_model(translator, base / "toy" / "1")
    with pytest.raises(ValueError, match="one directory name"):
        export_new_version(translator, "a/b", base_dir=str(base))
    with pytest.raises(SystemExit, match="No model.keras"):
        cli.main(["export", "--model-dir", str(tmp_path / "missing")])


@in_one_pass("jax", "a TensorFlow script on the SavedModel")
def test_translate_file_serves_a_file_as_the_translator_translates_it(exported, translator, tmp_path, monkeypatch,
                                                                    capsys):
    lines = [*SENTENCES, "the dog sees the old man and the cat ."] * 3
    (tmp_path / "input.en").write_text("".join(line + "\n" for line in lines))
    # Run in this process, as its command line would (a new one would import TensorFlow again).
    script = os.path.join(HERE, "..", "saved_models", "translate_file.py")
    monkeypatch.setattr(sys, "argv", [script, str(exported), "--input", str(tmp_path / "input.en"),
                                      "--output", str(tmp_path / "served.de"), "--batch-size", "4"])
    runpy.run_path(script, run_name="__main__")
    assert f"translated {len(lines)} lines" in capsys.readouterr().out
    # One translation per "\n"-ended line; an untrained model's output may hold
    # other line breaks (form feeds, from byte pieces).
    assert (tmp_path / "served.de").read_text().split("\n") == [*translator.translate(lines), ""]


@in_one_pass("tensorflow", "saved_models/README.md's Python blocks; each backend's export is tested in every pass")
def test_the_export_guide_blocks_export_and_serve_without_the_package(translator, tmp_path, monkeypatch):
    from test_docs_python import python_block, run, smaller

    monkeypatch.chdir(tmp_path)
    block = smaller(
        python_block("saved_models/README.md", "export_new_version(translator"),
        {'"/tmp/translator/1"': repr(str(tmp_path / "translator" / "1"))},
    )
    run(block, translator=translator)
    assert (tmp_path / "saved_models" / "quickstart" / "1" / "saved_model.pb").is_file()
    assert (tmp_path / "translator" / "1" / "saved_model.pb").is_file()
    # "No keras-transformer needed": a fresh process that imports TensorFlow only.
    served = subprocess.run(
        [sys.executable, "-c", python_block("saved_models/README.md", "tf.saved_model.load(")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert served.returncode == 0, served.stderr[-2000:]
    expected = translator.translate(["The old man sees the dog."])[0]
    assert repr(expected.encode("utf-8")) in served.stdout
