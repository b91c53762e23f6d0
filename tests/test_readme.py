"""The README's two commands are the ones CI and users run."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"test_command='([^']+)'", ci).group(1)
    first_screen = readme.split("## ")[0]
    assert command in first_screen
    assert "python recipes/quickstart.py" in first_screen
    assert (ROOT / "recipes" / "quickstart.py").is_file()
