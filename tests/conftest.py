import os
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Under JAX, the suite's processes (this one and the commands it starts) keep
# their compiled programs in one on-disk cache for this run: the same tiny
# models are compiled in many tests. It starts empty, and goes at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _jax_cache = tempfile.mkdtemp(prefix="keras-transformer-tests-jax-cache-")
    atexit.register(shutil.rmtree, _jax_cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _jax_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# The suite's models are tiny and each program runs for milliseconds, so
# LLVM's optimization of XLA's CPU code (JAX, and TensorFlow's searches and
# train steps) costs more than it saves: a third of the JAX pass's compile
# time. A user's programs keep XLA's default; so does a run that sets it.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
# XLA's older LLVM emitters compile in about half the time of its MLIR fusion
# emitters (test_compiled.py under JAX: 51 s of compiling against 27 s), for
# slower code (the reversal test: 76 CPU seconds against 87). The suite's
# programs are mostly compiling, so the JAX pass takes about a tenth less
# CPU time. TensorFlow's compile times did not change with it.
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ['XLA_FLAGS']} --xla_cpu_use_fusion_emitters=false"

# The suite runs with the command line's process settings
# (environment.configure_process); importing the package applies none.
# torch's threads read their wait policy when torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import keras_transformer  # noqa: E402

keras_transformer.configure_process()
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_report_header(config):
    return f"keras backend: {keras.backend.backend()}, keras {keras.__version__}"


@pytest.fixture(autouse=True)
def seeded():
    keras.utils.set_random_seed(1234)
    yield


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def random_ids(rng, shape, vocabulary_size, low=3):
    return rng.integers(low, vocabulary_size, size=shape).astype("int32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
MULTI30K = os.path.join(SHARED_DATA, "multi30k")
# The real corpora live beside the project, not in it (a user's clone has no
# ../shared); the tests on them run wherever that folder is, CI included.
needs_multi30k = pytest.mark.skipif(
    not os.path.isdir(MULTI30K), reason="../shared/data/multi30k is not beside this clone"
)



def write_reversal_files(directory, gzip_train=False):
    """Parallel files of a toy task (reverse six words): train (300 pairs)
    and valid (12) `.en`/`.de`, the training set gzipped if asked. With a
    320-piece vocabulary every word is one piece."""
    import gzip

    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(2, 5))) for _ in range(20)]
    for split, size in (("train", 300), ("valid", 12)):
        sources = [" ".join(rng.choice(words, 6)) for _ in range(size)]
        targets = [" ".join(reversed(source.split())) for source in sources]
        for side, lines in (("en", sources), ("de", targets)):
            text = "".join(line + "\n" for line in lines).encode()
            if split == "train" and gzip_train:
                (directory / f"{split}.{side}.gz").write_bytes(gzip.compress(text))
            else:
                (directory / f"{split}.{side}").write_bytes(text)
    return directory

def upstream_multi30k(directory):
    """A copy of Multi30k laid out as github.com/multi30k/dataset's
    data/task1/raw comes: gzipped, the test set named test_2016_flickr."""
    import gzip

    raw = directory / "task1" / "raw"
    raw.mkdir(parents=True)
    for split, upstream in (("train", "train"), ("val", "val"), ("test2016", "test_2016_flickr")):
        for language in ("en", "de"):
            with open(os.path.join(MULTI30K, f"{split}.{language}"), "rb") as file:
                (raw / f"{upstream}.{language}.gz").write_bytes(gzip.compress(file.read()))
    return raw


PTB_SAMPLE = os.path.join(SHARED_DATA, "ptb_wsj_sample")
# The treebank sample's licence keeps it out of the project; the parsing
# code itself is tested on hand-written trees wherever the suite runs.
needs_ptb_sample = pytest.mark.skipif(
    not os.path.isdir(PTB_SAMPLE), reason="../shared/data/ptb_wsj_sample is not beside this clone"
)

WMT14 = os.path.join(SHARED_DATA, "wmt14")
needs_wmt14 = pytest.mark.skipif(
    not os.path.isdir(WMT14), reason="../shared/data/wmt14 is not beside this clone"
)


# The two tiers. `python -m pytest` runs the quick tier; `--run-slow` adds
# the slow tier (the full suite, CI's). A test is slow by its measured time:
# over SLOW_SECONDS, setup and call, in a pass of CI's newest record,
# tests/durations.json, which `.ci/durations.py record` writes from CI's
# output. A test that needs a fixture the record measured as slow (its first
# user's setup) says so with `@slow`; tests/test_suite.py checks both.
SLOW_SECONDS = 10.0
RECORD = os.path.join(os.path.dirname(__file__), "durations.json")
slow = pytest.mark.slow


def measured_seconds():
    """{node id: seconds}: each test's longest setup and call in a pass of
    the record (a shared fixture is set up, and timed, in its first user)."""
    import json

    with open(RECORD) as file:
        passes = json.load(file)["passes"]
    longest = {}
    for run in passes.values():
        for test, (setup, call, _) in run["tests"].items():
            longest[test] = max(longest.get(test, 0.0), setup + call)
    return longest


def pytest_addoption(parser):
    parser.addoption(
        "--run-slow", action="store_true", default=False,
        help=f"the full tier: also the slow tests (over {SLOW_SECONDS:.0f} s in a pass of tests/durations.json)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"slow: over {SLOW_SECONDS:.0f} s in CI's record, or needs a fixture that is; runs with --run-slow"
    )


MARKED_SLOW = pytest.StashKey[dict]()


def split_tiers(items, measured):
    """(quick, slow) of `items`: each test the record `measured` over
    SLOW_SECONDS is marked slow first."""
    for item in items:
        if measured.get(item.nodeid, 0.0) > SLOW_SECONDS:
            item.add_marker(slow)
    quick = [item for item in items if item.get_closest_marker("slow") is None]
    return quick, [item for item in items if item.get_closest_marker("slow") is not None]


def named_tests(config):
    """The node ids named on the command line (`file.py::test`), from the root."""
    named = set()
    for argument in config.args:
        path, separator, name = argument.partition("::")
        if separator:
            named.add(f"{os.path.relpath(os.path.abspath(path), config.rootpath)}::{name}")
    return named


def pytest_collection_modifyitems(config, items):
    quick, slow_items = split_tiers(items, measured_seconds())
    config.stash[MARKED_SLOW] = {item.nodeid: item.get_closest_marker("slow") is not None for item in items}
    # A slow test named by its node id runs, as asked.
    named = named_tests(config)
    left_out = [item for item in slow_items if not any(item.nodeid.startswith(n) for n in named)]
    if left_out and not config.getoption("--run-slow"):
        config.hook.pytest_deselected(items=left_out)
        left_out_ids = {item.nodeid for item in left_out}
        items[:] = [item for item in items if item.nodeid not in left_out_ids]


def pytest_report_collectionfinish(config, start_path, items):
    if not config.getoption("--run-slow"):
        return "quick tier: slow tests deselected (tests/durations.json); --run-slow runs them too"


# CI runs the suite once per backend, three passes side by side, and says so
# in this variable (.ci/run); a person's run, under one backend, leaves it unset.
PASSES = [name for name in os.environ.get("KT_TEST_PASSES", "").split(",") if name]


def in_passes(backends, why):
    """For a test of code that runs the same under every backend (command-line
    plumbing, file layouts, TensorFlow-only serving): a run under one backend
    runs it; CI's passes, one per backend, run it in `backends`' only. The
    code each backend runs differently is tested in every pass."""
    return pytest.mark.skipif(
        bool(PASSES) and keras.backend.backend() not in backends and any(b in PASSES for b in backends),
        reason=f"the same under every backend ({why}); runs in the {' and '.join(backends)} pass"
        + "es" * (len(backends) > 1),
    )


def runs_in_this_pass(backend):
    """Whether a part of a test that `in_one_pass(backend, ...)` would mark
    runs here: under `backend`'s pass, or outside CI's passes."""
    return not PASSES or backend not in PASSES or keras.backend.backend() == backend


def as_a_process(capsys, call):
    """`call()` (a script's `main`) run in this process, which saves the
    seconds of a start-up: its exit status, stdout and stderr as the
    process's would be (`sys.exit("error: ...")` prints the line and exits
    with 1). Another exception fails the test, as a traceback would."""
    import subprocess

    capsys.readouterr()  # what came before
    code = 0
    try:
        call()
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    if isinstance(code, str):
        return subprocess.CompletedProcess([], 1, out, err + code + "\n")
    return subprocess.CompletedProcess([], code or 0, out, err)


def in_one_pass(backend, why):
    return in_passes((backend,), why)


def torch_operations():
    """A context whose `operations` lists each torch operation (an
    `aten` overload) dispatched inside it, in order, and `arguments` their
    arguments: under torch each is a kernel launch, or, for
    `_local_scalar_dense`, a read back to the host."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Operations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.operations = []
            self.arguments = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.operations.append(func)
            self.arguments.append(args)
            return func(*args, **(kwargs or {}))

    return Operations()


def assert_cached_decoding_matches(model, batch):
    """Decoding `batch`'s targets one position at a time from the cache
    gives the logits of the full forward pass at every position."""
    logits = to_numpy(model(batch))
    length = batch["target_ids"].shape[1]
    encoder_output, encoder_padding_mask = model.encode(batch["source_ids"])
    cache = model.initial_cache(encoder_output, max_length=length)
    for index in range(length):
        step_logits, cache = model.decode_step(
            batch["target_ids"][:, index : index + 1], cache, index, encoder_padding_mask
        )
        np.testing.assert_allclose(to_numpy(step_logits)[:, 0], logits[:, index], atol=1e-5)


@pytest.fixture(scope="session")
def translation_tokenizer():
    """The decoding tests' tokenizer (translation_fixtures.py)."""
    import translation_fixtures

    return translation_fixtures.make_tokenizer()


@pytest.fixture(scope="session")
def translation_model(translation_tokenizer):
    """The decoding tests' untrained tiny model (translation_fixtures.py)."""
    import translation_fixtures

    return translation_fixtures.make_model(translation_tokenizer)


def code_key(*files):
    """What a result made from the package depends on: its code, `files`
    and the versions of what it runs on."""
    import hashlib
    import importlib.metadata
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted([*map(pathlib.Path, files), *(root / "keras_transformer").rglob("*.py")]):
        digest.update(path.resolve().relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    for package in ("keras", "tensorflow", "tensorflow-text", "jax", "torch", "sentencepiece", "sacrebleu"):
        digest.update(f"{package}=={importlib.metadata.version(package)}\n".encode())
    return digest.hexdigest()[:16]


def made_once_across_passes(request, name, make, *files):
    """A directory that `make(directory)` fills, made once for the code and
    versions (`code_key(*files)`) and kept in pytest's cache: of CI's three
    backend passes, which run side by side, the first to ask makes it while
    the others wait for it. The path of the filled directory."""
    import fcntl
    import pathlib
    import shutil
    import tempfile

    cache = getattr(request.config, "cache", None)
    if cache is None:  # pytest -p no:cacheprovider
        directory = pathlib.Path(tempfile.mkdtemp(prefix=f"{name}-"))
        make(directory)
        return directory
    saved = cache.mkdir(f"{name}-{code_key(*files)}")
    with open(saved.with_name(saved.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not (saved / "done").is_file():
            # Made aside and renamed over the empty entry in one step, so
            # that a pass killed midway leaves no half entry behind.
            staging = saved.with_name(f"{saved.name}.partial-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            make(staging)
            (staging / "done").write_text(keras.backend.backend() + "\n")
            shutil.rmtree(saved)
            staging.rename(saved)
    return saved


# The fixture made ahead, in a thread, and the module of its tests: a test
# marked slow by hand for needing it may measure quick in the record, since
# the thread, not its setup, spent the time (tests/test_suite.py).
MADE_AHEAD = ("tests/test_readme.py", "workdir")


def pytest_collection_finish(session):
    """Starts the README's quick start training (`test_readme.py`'s
    `workdir`, minutes of a TensorFlow process) in a thread as soon as the
    tests that need it are collected, so that it runs beside the tests
    before them instead of holding up the pass that gets there first."""
    if getattr(session.config, "cache", None) is None:
        return
    for item in session.items:
        if MADE_AHEAD[1] in getattr(item, "fixturenames", ()) and item.nodeid.startswith(MADE_AHEAD[0] + "::"):
            module = item.module
            threading.Thread(target=_make_ahead, args=(session.config, module), daemon=True).start()
            return


def _make_ahead(config, module):
    import types

    try:
        module.quickstart_run(types.SimpleNamespace(config=config))
    except Exception:  # noqa: BLE001 - the fixture makes it again, in the test, and reports why it failed
        pass
