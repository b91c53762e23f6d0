"""The suite's measured times, per pass of `.ci/run`: recorded, compared, listed.

    python .ci/durations.py record CI_LOG [-o tests/durations.json] --machine TEXT [--slowest N]
    python .ci/durations.py compare OLD.json NEW.json
    python .ci/durations.py slowest [tests/durations.json] [-n 20]

`record` reads what `.ci/run` printed (it shows every test's time) and
writes each pass's wall time, pytest's summary line and each test's seconds
of setup, call and teardown (a fixture shared by several tests is set up,
and timed, in the first of them). `tests/durations.json` is the record of
the newest such run: tests/conftest.py reads it to put the tests over 10 s
in the slow tier, and the next change compares against it.
"""

import argparse
import json
import pathlib
import re
import sys

PASS_START = re.compile(r"^=== KERAS_BACKEND=(\w+): (passed|FAILED)$")
PASS_END = re.compile(r"^=== KERAS_BACKEND=(\w+): exit (\d+) after (\d+)s$")
WITHOUT_TF_START = re.compile(r"^=== KERAS_BACKEND=torch, without TensorFlow:")
WITHOUT_TF_END = re.compile(r"^=== without TensorFlow: (\d+)s$")
TOTAL = re.compile(r"^=== install and all passes: (\d+)s$")
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S.*)$")
PHASES = ("setup", "call", "teardown")
SUMMARY = re.compile(r"^=+ (.*\b(?:passed|failed)\b.*) in [\d.]+s")
# pytest's report of one failure: "____ test_name[param] ____", then its lines.
FAILURE = re.compile(r"^_{3,} (\S.*?) _{3,}$")
SECTION = re.compile(r"^={3,} .* ={3,}$")
WITHOUT_TENSORFLOW = "torch-without-tensorflow"
FAILURE_LINES = 30
PLACE = re.compile(r"^\S+\.py:\d+: ")


def new_pass():
    return {"seconds": None, "summary": None, "tests": {}, "failures": {}}


def parse(text):
    """{pass: {"seconds", "summary", "tests": {node id: [setup, call, teardown]}}}
    and the total, in seconds."""
    passes, current, total, failure = {}, None, None, None
    for line in text.splitlines():
        if current is not None and (match := FAILURE.match(line)):
            failure = current["failures"].setdefault(match[1], [])
            continue
        if SECTION.match(line) or line.startswith("=== "):
            failure = None
        elif failure is not None:
            failure.append(line)
            continue
        if match := PASS_START.match(line):
            current = passes.setdefault(match[1], new_pass())
        elif WITHOUT_TF_START.match(line):
            current = passes.setdefault(WITHOUT_TENSORFLOW, new_pass())
        elif match := PASS_END.match(line):
            passes.setdefault(match[1], new_pass())["seconds"] = int(match[3])
        elif (match := WITHOUT_TF_END.match(line)) and WITHOUT_TENSORFLOW in passes:
            passes[WITHOUT_TENSORFLOW]["seconds"] = int(match[1])
        elif match := TOTAL.match(line):
            total = int(match[1])
        elif current is not None and (match := DURATION.match(line)):
            phases = current["tests"].setdefault(match[3], [0.0, 0.0, 0.0])
            phases[PHASES.index(match[2])] = float(match[1])
        elif current is not None and (match := SUMMARY.match(line)):
            current["summary"] = match[1]
    if not passes or not any(p["tests"] for p in passes.values()):
        raise ValueError(
            "No pass with test durations found. Expected the output of `bash .ci/run`, "
            "whose passes show every test's time (--durations=0)."
        )
    return passes, total


def load(path):
    return json.loads(pathlib.Path(path).read_text())


def record(arguments):
    passes, total = parse(pathlib.Path(arguments.log).read_text(errors="replace"))
    result = {
        "command": "bash .ci/run",
        "machine": arguments.machine,
        "total_seconds": total,
        "passes": {
            name: {key: dict(sorted(value.items())) if key == "tests" else value
                   for key, value in p.items() if value or key != "failures"}
            for name, p in passes.items()
        },
    }
    # One line a test, so that the next record's diff reads test by test.
    text = json.dumps(result, indent=1)
    text = re.sub(r"\[\n\s*([\d.]+),\n\s*([\d.]+),\n\s*([\d.]+)\n\s*\]", r"[\1, \2, \3]", text)
    pathlib.Path(arguments.output).write_text(text + "\n")
    for name, p in passes.items():
        print(f"{name}: {p['seconds']} s, {len(p['tests'])} tests timed, {p['summary']}")
    print(f"all passes: {total} s (record: {arguments.output})")
    # What each failure ended with, where the tail of CI's log still shows it.
    for name, p in passes.items():
        for test, lines in p.get("failures", {}).items():
            print(f"FAILED in the {name} pass: {test}")
            for line in what_failed(lines):
                print(f"  | {line[:300]}")
    if arguments.slowest:
        print(f"the {arguments.slowest} slowest tests:")
        for time, name, test in slowest(result, arguments.slowest):
            print(f"{time:8.1f}  {name:12} {test}")
    # Last, the count of every pass together, in pytest's words.
    counts = {word: 0 for word in ("passed", "failed", "error", "skipped", "deselected")}
    for p in passes.values():
        for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", p["summary"] or ""):
            counts[word.rstrip("s") if word.startswith("error") else word] += int(number)
    print(", ".join(f"{n} {word}" for word, n in counts.items() if n or word in ("passed", "failed")))


def what_failed(lines):
    """A failure's error lines ("E   ...") and the places it passed through,
    else its last lines: the part that says what went wrong."""
    said = [line for line in lines if line.startswith("E ") or PLACE.match(line)]
    return (said or lines)[-FAILURE_LINES:]


def seconds(phases):
    return sum(phases)


def slowest(run, count):
    """The `count` slowest (seconds, pass, node id) of a record."""
    rows = [(seconds(t), name, test) for name, p in run["passes"].items() for test, t in p["tests"].items()]
    return sorted(rows, reverse=True)[:count]


def compare(arguments):
    old, new = load(arguments.old), load(arguments.new)
    print(f"{'pass':26} {'old s':>8} {'new s':>8} {'old sum':>9} {'new sum':>9} {'old n':>6} {'new n':>6}")
    for name in sorted(set(old["passes"]) | set(new["passes"])):
        a, b = old["passes"].get(name, {}), new["passes"].get(name, {})
        print(
            f"{name:26} {a.get('seconds') or '-':>8} {b.get('seconds') or '-':>8}"
            f" {sum(map(seconds, a.get('tests', {}).values())):9.0f}"
            f" {sum(map(seconds, b.get('tests', {}).values())):9.0f}"
            f" {len(a.get('tests', {})):6} {len(b.get('tests', {})):6}"
        )
    print(f"{'total':26} {old.get('total_seconds') or '-':>8} {new.get('total_seconds') or '-':>8}")
    changes = []
    for name in new["passes"]:
        before = old["passes"].get(name, {}).get("tests", {})
        after = new["passes"][name]["tests"]
        for test in set(before) | set(after):
            changes.append((seconds(after.get(test, [])) - seconds(before.get(test, [])), name, test))
    print(f"\nlargest changes (new - old, seconds), of {len(changes)}:")
    for delta, name, test in sorted(changes, key=lambda row: -abs(row[0]))[: arguments.count]:
        print(f"{delta:+9.1f}  {name:12} {test}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("record", help="write a record from .ci/run's output")
    p.add_argument("log")
    p.add_argument("-o", "--output", default="tests/durations.json")
    p.add_argument("--machine", required=True, help="the CPU and cores it ran on, e.g. from lscpu")
    p.add_argument("--slowest", type=int, default=0, metavar="N", help="also print the N slowest tests")
    p = commands.add_parser("compare", help="two records, pass by pass and test by test")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("-n", "--count", type=int, default=30)
    p = commands.add_parser("slowest", help="a record's slowest tests")
    p.add_argument("record", nargs="?", default="tests/durations.json")
    p.add_argument("-n", "--count", type=int, default=20)
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "record":
            record(arguments)
        elif arguments.command == "compare":
            compare(arguments)
        else:
            for time, name, test in slowest(load(arguments.record), arguments.count):
                print(f"{time:8.1f}  {name:12} {test}")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
