"""The suite's two tiers, held to CI's measured times (tests/durations.json),
and the script that records those times (.ci/durations.py)."""

import pathlib
import subprocess
import sys

from conftest import MADE_AHEAD, MARKED_SLOW, RECORD, SLOW_SECONDS, in_one_pass, measured_seconds, named_tests, split_tiers

ROOT = pathlib.Path(__file__).resolve().parent.parent

sys.path.insert(0, str(ROOT / ".ci"))
import durations  # noqa: E402

sys.path.pop(0)


@in_one_pass("tensorflow", "reads the record and the markers, the same under every backend")
def test_a_test_marked_slow_by_hand_needs_a_fixture_the_record_measured_slow(request):
    """Tests marked slow by the record are slow by measurement. One marked
    by hand must share its module with a test whose setup (where a shared
    fixture is made) the record measured over the limit, or be in the module
    whose fixture is made ahead in a thread (conftest.MADE_AHEAD)."""
    record = durations.load(RECORD)["passes"]
    slow_setups = {test.split("::")[0] for run in record.values()
                   for test, (setup, _, _) in run["tests"].items() if setup > SLOW_SECONDS} | {MADE_AHEAD[0]}
    measured = measured_seconds()
    guessed = sorted(test for test, slow in request.config.stash[MARKED_SLOW].items()
                     if slow and measured.get(test, 0.0) <= SLOW_SECONDS and test.split("::")[0] not in slow_setups)
    assert not guessed, f"marked slow, but neither they nor a fixture of theirs measured over {SLOW_SECONDS} s: {guessed}"


@in_one_pass("tensorflow", "reads the record, the same under every backend")
def test_the_record_has_every_pass_of_ci_and_their_times():
    record = durations.load(RECORD)
    assert set(record["passes"]) == {"tensorflow", "jax", "torch", durations.WITHOUT_TENSORFLOW}
    assert record["total_seconds"] > 0 and record["machine"]
    for run in record["passes"].values():
        assert run["seconds"] > 0 and "passed" in run["summary"], run["summary"]
        assert len(run["tests"]) > 10


LOG = """\
=== KERAS_BACKEND=jax python -m pytest (log: /tmp/x/jax.log)
=== KERAS_BACKEND=jax: passed
tests/test_a.py ..s                                                      [100%]
============================= slowest durations ==============================
12.50s call     tests/test_a.py::test_slow[64-bit ids past int32]
1.25s setup    tests/test_a.py::test_slow[64-bit ids past int32]
0.01s teardown tests/test_a.py::test_slow[64-bit ids past int32]
0.30s call     tests/test_a.py::test_quick
=================== 2 passed, 1 skipped, 3 deselected in 14.20s ===================
=== KERAS_BACKEND=jax: exit 0 after 15s
=== KERAS_BACKEND=torch: FAILED
=================================== FAILURES ===================================
_________________________ test_loss[bucketed] __________________________
    def test_loss():
>       assert loss < 1
E       AssertionError: loss 3.5
E       assert 3.5 < 1
tests/test_a.py:7: AssertionError
----------------------------- Captured stderr call -----------------------------
a warning the test printed
============================= slowest durations ==============================
2.00s call     tests/test_a.py::test_quick
========================= 1 failed, 1 passed in 3.00s ==========================
=== KERAS_BACKEND=torch: exit 1 after 4s
=== KERAS_BACKEND=torch, without TensorFlow: python -m pytest tests/test_b.py
0.50s call     tests/test_b.py::test_data
============================== 1 passed in 0.90s ===============================
=== without TensorFlow: 2s
=== install and all passes: 80s
"""


def test_durations_reads_each_pass_of_ci_s_output(tmp_path, capsys):
    passes, total = durations.parse(LOG)
    assert total == 80
    assert passes["jax"] == {
        "seconds": 15, "summary": "2 passed, 1 skipped, 3 deselected", "failures": {},
        "tests": {"tests/test_a.py::test_slow[64-bit ids past int32]": [1.25, 12.5, 0.01],
                  "tests/test_a.py::test_quick": [0.0, 0.3, 0.0]},
    }
    assert passes["torch"]["summary"] == "1 failed, 1 passed" and passes["torch"]["seconds"] == 4
    assert passes["torch"]["failures"]["test_loss[bucketed]"][-3:] == [
        "tests/test_a.py:7: AssertionError", "-" * 29 + " Captured stderr call " + "-" * 29, "a warning the test printed"]
    assert passes[durations.WITHOUT_TENSORFLOW]["tests"] == {"tests/test_b.py::test_data": [0.0, 0.5, 0.0]}
    (tmp_path / "ci.log").write_text(LOG)
    record = tmp_path / "record.json"
    assert durations.main(["record", str(tmp_path / "ci.log"), "-o", str(record), "--machine", "test", "--slowest", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-7:] == [  # the last line in the form CI reads a test runner's closing line
        "FAILED in the torch pass: test_loss[bucketed]",  # what went wrong, where CI's tail shows it
        "  | E       AssertionError: loss 3.5", "  | E       assert 3.5 < 1", "  | tests/test_a.py:7: AssertionError",
        "the 1 slowest tests:", "    13.8  jax          tests/test_a.py::test_slow[64-bit ids past int32]",
        "4 passed, 1 failed, 1 skipped, 3 deselected",
    ]
    assert durations.slowest(durations.load(record), 1) == [(13.76, "jax", "tests/test_a.py::test_slow[64-bit ids past int32]")]


def test_durations_says_in_one_line_what_it_expected(tmp_path):
    (tmp_path / "ci.log").write_text("=== KERAS_BACKEND=jax: passed\n1 passed in 2s\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "durations.py"), "record", str(tmp_path / "ci.log"), "--machine", "x"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: No pass with test durations found. Expected the output of")
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "tests").exists()


class Item:
    """What the tiers read of a pytest item."""

    def __init__(self, nodeid, marked=False):
        self.nodeid, self.markers = nodeid, ["slow"] if marked else []

    def add_marker(self, marker):
        self.markers.append(marker.name)

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def test_the_slow_tier_is_the_tests_measured_over_the_limit_and_those_marked_by_hand():
    items = [Item("a"), Item("b"), Item("c", marked=True), Item("d")]
    quick, slow = split_tiers(items, {"a": SLOW_SECONDS + 0.5, "b": SLOW_SECONDS, "c": 1.0})
    assert [item.nodeid for item in quick] == ["b", "d"]
    assert [item.nodeid for item in slow] == ["a", "c"]


def test_a_slow_test_named_on_the_command_line_is_known_by_its_node_id(monkeypatch):
    class Config:
        rootpath = ROOT
        args = ["tests/test_learning.py", str(ROOT / "tests" / "test_training.py") + "::test_kill[a b]", "-k x"]

    monkeypatch.chdir(ROOT)
    assert named_tests(Config) == {"tests/test_training.py::test_kill[a b]"}
