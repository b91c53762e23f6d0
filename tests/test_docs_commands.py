"""Every shell and Python block in the README and the docs either runs in a
test or says why it does not (a GPU, data or hours the suite does not have,
Docker, a download)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "saved_models/README.md"]
# The first line of a block that no test runs.
MARKER = re.compile(r"^# not run by the tests: \S")

# (file, a line of the block) -> the test that runs the block's commands.
TESTED = {
    ("README.md", 'pip install -e ".[test]" && python -m pytest'): "test_readme.py::test_ci_runs_the_readme_test_commands",
    ("README.md", "KERAS_BACKEND=jax python recipes/quickstart.py"): "test_readme.py::test_the_quick_start_runs_under_this_backend",
    ("README.md", 'echo "The old man sees the dog."'): "test_readme.py::test_the_readme_translate_example_prints_what_it_shows",
    ("README.md", "python -m keras_transformer plot-attention"): "test_readme.py::test_the_readme_command_line_examples_print_what_they_show",
    ("README.md", "docker run --rm -p 8501:8501"): "test_readme.py::test_the_readme_export_serves_the_curl_example",
    ("README.md", "python -m keras_transformer serve"): "test_readme.py::test_the_readme_serve_command_answers_its_curl_example",
    ("saved_models/README.md", "python saved_models/translate_file.py"): "test_export.py::test_translate_file_serves_a_file_as_the_translator_translates_it",
}

KERAS_GUIDE = "test_guide_keras.py::test_the_guide_s_script_trains_saves_goes_on_under_another_backend_and_reuses_the_layers"
KERAS_GUIDE_EXPORT = "test_guide_keras.py::test_the_guide_s_export_loads_in_a_fresh_python_with_its_operations"
PYTHON_TESTED = {
    ("README.md", "model.fit("): "test_docs_python.py::test_the_model_block_builds_the_base_model_and_fits_a_step",
    ("docs/guide.md", "model.fit("): "test_docs_python.py::test_the_model_block_builds_the_base_model_and_fits_a_step",
    ("README.md", 'kt.Translator.load("runs/quickstart")'): "test_readme.py::test_the_readme_python_examples_return_what_they_show",
    ("docs/decoding.md", 'kt.Translator.load("runs/quickstart")'): "test_docs_python.py::test_the_decoding_guide_shows_the_readme_translator_block",
    ("docs/decoding.md", "model.decode_step("): "test_docs_python.py::test_the_decoding_blocks_run_on_a_tiny_model",
    ("docs/decoding.md", "kt.decoding.beam_search("): "test_docs_python.py::test_the_decoding_blocks_run_on_a_tiny_model",
    ("docs/decoding.md", "kt.decoding.SearchSettings("): "test_settings.py::test_the_decoding_guide_s_settings_block_prints_what_it_shows",
    ("docs/data.md", "make_dataset("): "test_docs_python.py::test_the_data_and_training_blocks_train_on_their_files",
    ("docs/training.md", "training.Distribution()"): "test_docs_python.py::test_the_data_and_training_blocks_train_on_their_files",
    ("docs/guide.md", "attention_window=10"): "test_table3_options.py::test_the_guide_example_prints_what_it_shows",
    ("saved_models/README.md", "export_new_version(translator"): "test_export.py::test_the_export_guide_blocks_export_and_serve_without_the_package",
    ("saved_models/README.md", 'tf.saved_model.load("saved_models/quickstart/1")'): "test_export.py::test_the_export_guide_blocks_export_and_serve_without_the_package",
    ("docs/guide_keras.md", "make_dataset(train_pairs"): KERAS_GUIDE,
    ("docs/guide_keras.md", "keras.callbacks.EarlyStopping"): KERAS_GUIDE,
    ("docs/guide_keras.md", "# continue.py"): KERAS_GUIDE,
    ("docs/guide_keras.md", "compile=True)"): KERAS_GUIDE,
    ("docs/guide_keras.md", "kt.layers.TransformerEncoderBlock"): KERAS_GUIDE,
    ("docs/guide_keras.md", "export_saved_model(translator"): KERAS_GUIDE_EXPORT,
    ("docs/guide_keras.md", "load_saved_model("): KERAS_GUIDE_EXPORT,
}


def blocks(language):
    for name in DOCS:
        for block in re.findall(rf"```{language}\n(.*?)```", (ROOT / name).read_text(), re.S):
            yield name, block


@pytest.mark.parametrize(
    "language, name, block",
    [("bash", *b) for b in blocks("bash")] + [("python", *b) for b in blocks("python")],
    ids=lambda value: str(value)[:40],
)
def test_a_block_runs_in_a_test_or_says_why_not(language, name, block):
    named = TESTED if language == "bash" else PYTHON_TESTED
    tested = [test for (where, line), test in named.items() if where == name and line in block]
    first = block.strip().splitlines()[0]
    assert tested or MARKER.match(first), (
        f"{name}: a {language} block that no test runs must begin with '# not run by the tests: <why>':\n{block}"
    )


@pytest.mark.parametrize("language, named", [("bash", TESTED), ("python", PYTHON_TESTED)])
def test_the_tests_named_for_blocks_exist_and_their_blocks_too(language, named):
    found = list(blocks(language))
    for (name, line), test in named.items():
        assert any(where == name and line in block for where, block in found), (name, line)
        module, function = test.split("::")
        assert f"def {function}(" in (ROOT / "tests" / module).read_text(), test
