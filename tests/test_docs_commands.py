"""Every shell block in the README and the docs either runs in a test or says
why it does not (a GPU, data or hours the suite does not have, Docker)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "saved_models/README.md"]
# The first line of a block that no test runs.
MARKER = re.compile(r"^# not run by the tests: \S")

# (file, a line of the block) -> the test that runs the block's commands.
TESTED = {
    ("README.md", 'pip install -e ".[test]" && python -m pytest'): "test_readme.py::test_ci_runs_the_readme_test_command",
    ("README.md", "KERAS_BACKEND=jax python recipes/quickstart.py"): "test_readme.py::test_the_quick_start_runs_under_this_backend",
    ("README.md", 'echo "The old man sees the dog."'): "test_readme.py::test_the_readme_translate_example_prints_what_it_shows",
    ("README.md", "python -m keras_transformer plot-attention"): "test_readme.py::test_the_readme_command_line_examples_print_what_they_show",
    ("README.md", "docker run --rm -p 8501:8501"): "test_readme.py::test_the_readme_export_serves_the_curl_example",
    ("saved_models/README.md", "python saved_models/translate_file.py"): "test_export.py::test_translate_file_serves_a_file_as_the_translator_translates_it",
}


def shell_blocks():
    for name in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", (ROOT / name).read_text(), re.S):
            yield name, block


@pytest.mark.parametrize("name, block", list(shell_blocks()), ids=lambda value: str(value)[:40])
def test_a_shell_block_runs_in_a_test_or_says_why_not(name, block):
    tested = [test for (where, line), test in TESTED.items() if where == name and line in block]
    first = block.strip().splitlines()[0]
    assert tested or MARKER.match(first), (
        f"{name}: a shell block that no test runs must begin with '# not run by the tests: <why>':\n{block}"
    )


def test_the_tests_named_for_blocks_exist_and_their_blocks_too():
    blocks = list(shell_blocks())
    for (name, line), test in TESTED.items():
        assert any(where == name and line in block for where, block in blocks), (name, line)
        module, function = test.split("::")
        assert f"def {function}(" in (ROOT / "tests" / module).read_text(), test
