"""Preparing, loading and training from corpora of 0.5, 4.5 and 36 million pairs.

    python benchmarks/data_scale.py [--sizes 0.5 4.5 36] [--backends tensorflow jax]

The corpora are Multi30k's training text (29,000 pairs) repeated to each size
(`--sizes`, in millions of pairs), written under `--work` (default
`runs/data_scale/`, which git ignores). For each size it measures:

1. `keras-transformer prepare --vocabulary DIR`: wall seconds of the command
   and sentences per second per core (pairs * 2 / seconds / cores). The
   vocabulary (`--vocabulary-size` pieces) is trained once, by `prepare` on
   the smallest corpus, and reused for every size; its time is reported
   apart: the arrival of prepare's "vocabulary:" line after process start.
2. `keras-transformer train --train-data DIR --preset tiny --train-steps 3`,
   under each backend of `--backends`, as a subprocess: its peak resident
   memory (`ru_maxrss` of `os.wait4`, which counts the pages of the mapped
   prepared set it has read, too), the peaks of its anonymous and
   file-backed parts (RssAnon, RssFile, sampled every 50 ms), and the
   seconds from process start to the arrival of its "step 1/..." line (so including imports, loading, the batch
   plan and the first step's compilation). The lines before it are kept,
   with their arrival times, to say where those seconds went.
3. The loader: `TokenBatches(load_prepared(DIR), tokens_per_batch,
   max_length=128, repeat=True, seed=0)` in a fresh process (so its memory
   is its own), timed over `--loader-batches` batches by index, and over
   the same batches again, which the page cache then holds; reported as
   non-padding target tokens (labels != 0) per second, with the seconds of
   the constructor and of the first batch (which shuffles epoch 0's plan)
   and the resident memory after each stage.

`--drop-page-cache` (Linux, as root) empties the page cache before each
loader run, so that its first pass reads the disk: the cold start of a
run. The second pass is what the 2 cores deliver once the set is cached.

`--loader DIR` times only the loader, on the prepared set in DIR, and
prints its figures as JSON lines.

`--reuse-prepared` keeps the vocabulary and prepared sets of a former run
(and its prepare figures) and measures train and the loader again.

The figures go to `--json` and a plot of them against the corpus size to
`--plot`, each with the targets: train's peak memory at the largest size at
most 1.3x its peak at the smallest and at most 3 GB; the first step within
30 s; the loader at least 1 million target tokens per second.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_DATA = "multi30k"  # github.com/multi30k/dataset, data/task1/raw, unzipped
TARGETS = {"memory_ratio": 1.3, "memory_mb": 3000, "first_step_seconds": 30, "loader_tokens_per_second": 1e6}


def memory_mb(pid="self"):
    """VmRSS, VmHWM, RssAnon and RssFile of a process, MB, from /proc."""
    with open(f"/proc/{pid}/status") as file:
        fields = dict(line.split(":", 1) for line in file)
    return {name: round(int(fields[name].split()[0]) / 1024, 1) for name in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


def watch_memory(pid, peaks, done):
    """Keeps in `peaks` the largest RssAnon and RssFile of `pid` seen every
    50 ms: what of its resident memory is its own, what mapped files."""
    while not done.wait(0.05):
        try:
            now = memory_mb(pid)
        except (OSError, KeyError, ValueError):  # exiting
            continue
        for name in ("RssAnon", "RssFile"):
            peaks[name] = max(peaks.get(name, 0.0), now[name])


def timed_command(command, log_path, env=None, stop_at=None):
    """Runs `command`, stdout and stderr merged into `log_path`.

    Returns:
        dict: `seconds` (wall), `peak_rss_mb` (the child's `ru_maxrss`),
        `peak_anon_mb` and `peak_file_mb` (the largest RssAnon and RssFile
        sampled), and `lines`: [seconds after start, line] of each line up
        to and including the first that contains `stop_at` (all lines
        without it).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    lines, collecting, peaks, done = [], True, {}, threading.Event()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        started = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        watcher = threading.Thread(target=watch_memory, args=(process.pid, peaks, done), daemon=True)
        watcher.start()
        for line in process.stdout:
            now = time.perf_counter() - started
            log.write(f"[{now:8.2f}s] {line}")
            if collecting:
                lines.append([round(now, 2), line.rstrip()[:160]])
                collecting = stop_at is None or stop_at not in line
        done.set()
        watcher.join()
        # wait4, not Popen.wait: the rusage of this child alone.
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}); see {log_path}")
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "peak_anon_mb": peaks.get("RssAnon"),
        "peak_file_mb": peaks.get("RssFile"),
        "lines": lines,
    }


def arrival(lines, text):
    """Seconds after start at which the first line containing `text` came."""
    return next((seconds for seconds, line in lines if text in line), None)


def repeated_corpus(data_dir, folder, pairs):
    """`folder`/train.en and train.de: Multi30k's training pairs repeated
    to `pairs` lines (kept when a file of the right size is there)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for language in ("en", "de"):
        with open(os.path.join(data_dir, f"train.{language}"), "rb") as file:
            base = file.read()
        if not base.endswith(b"\n"):
            base += b"\n"
        lines = base.splitlines(keepends=True)
        copies, rest = divmod(pairs, len(lines))
        tail = b"".join(lines[:rest])
        path = os.path.join(folder, f"train.{language}")
        paths.append(path)
        if os.path.isfile(path) and os.path.getsize(path) == copies * len(base) + len(tail):
            continue
        block = base * 32
        with open(path + ".partial", "wb") as file:
            for done in range(0, copies, 32):
                file.write(block if copies - done >= 32 else base * (copies - done))
            file.write(tail)
        os.replace(path + ".partial", path)
    return paths


def measure_loader(directory, tokens_per_batch, batches):
    """Times TokenBatches on a prepared set in this process; prints JSON."""
    memory = {"start": memory_mb()}
    import numpy as np

    from keras_transformer.data.batches import TokenBatches
    from keras_transformer.data.prepared import load_prepared

    memory["imports"] = memory_mb()
    pairs = load_prepared(directory)
    started = time.perf_counter()
    data = TokenBatches(pairs, tokens_per_batch, max_length=128, repeat=True, seed=0)
    constructor = time.perf_counter() - started
    memory["constructor"] = memory_mb()
    started = time.perf_counter()
    data[0]  # shuffles epoch 0's plan
    first = time.perf_counter() - started
    memory["first_batch"] = memory_mb()
    passes = []
    for _ in range(2):  # the second pass reads the same batches from the page cache
        tokens = 0
        started = time.perf_counter()
        for index in range(1, batches + 1):
            _, labels = data[index]
            tokens += int(np.count_nonzero(labels))
        passes.append(time.perf_counter() - started)
    memory["batches"] = memory_mb()
    print(json.dumps({
        "tokens_per_batch": tokens_per_batch,
        "constructor_seconds": round(constructor, 3),
        "first_batch_seconds": round(first, 3),
        "batches": batches,
        "batch_seconds": round(passes[0], 3),
        "target_tokens": tokens,
        "target_tokens_per_second": round(tokens / passes[0]),
        "cached_target_tokens_per_second": round(tokens / passes[1]),
        "memory_mb": memory,
    }))


def drop_page_cache():
    """Empties Linux's page cache (as root), so the loader's first pass reads the disk."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as file:
            file.write("1\n")
    except OSError as error:
        sys.exit(f"error: --drop-page-cache needs root on Linux: {error}")


def machine():
    model = next(
        (line.split(":", 1)[1].strip() for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")),
        platform.processor(),
    )
    with open("/proc/meminfo") as file:
        memory_gb = int(file.readline().split()[1]) / 2**20
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(memory_gb, 1), "python": platform.python_version()}


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row["pairs"] / 1e6 for row in report["sizes"]]
    figure, axes = plt.subplots(1, 3, figsize=(14, 5))
    for backend in report["backends"]:
        runs = [row["train"][backend] for row in report["sizes"]]
        line, = axes[0].plot(sizes, [run["peak_rss_mb"] for run in runs], "o-", label=f"train, {backend}")
        if all(run.get("peak_anon_mb") for run in runs):
            axes[0].plot(sizes, [run["peak_anon_mb"] for run in runs], "s--", color=line.get_color(),
                         label=f"train, {backend}: anonymous only")
        axes[0].axhline(runs[0]["peak_rss_mb"] * TARGETS["memory_ratio"], color=line.get_color(), linestyle=":",
                        label=f"target: 1.3x the smallest's, {backend}")
        axes[1].plot(sizes, [run["first_step_seconds"] for run in runs], "o-", label=f"train, {backend}")
    axes[0].axhline(TARGETS["memory_mb"], color="gray", linestyle="--", label="target: 3 GB")
    axes[0].set(title=f"peak resident memory of train ({report.get('train_steps', 3)} steps)", ylabel="MB")
    axes[1].axhline(TARGETS["first_step_seconds"], color="gray", linestyle="--", label="target: 30 s")
    axes[1].set(title="process start to step 1 of train", ylabel="seconds")
    axes[2].plot(sizes, [row["prepare"]["seconds"] for row in report["sizes"]], "o-", label="prepare (wall)")
    axes[2].set(title="prepare, with a trained vocabulary", ylabel="seconds")
    for axis in axes:
        axis.set(xscale="log", xlabel="corpus size (million pairs)", xticks=sizes, xticklabels=[f"{s:g}" for s in sizes])
        axis.minorticks_off()
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=7, loc="lower right")
        axis.grid(alpha=0.3)
    figure.suptitle(f"Corpora of Multi30k repeated; {report['machine']['cpu']}, {report['machine']['cores']} cores")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def reused(path, reuse):
    """The figures a former run wrote to `path`, with --reuse-prepared."""
    if reuse and os.path.isfile(path):
        with open(path) as file:
            return json.load(file) | {"reused_from": os.path.relpath(path, REPO)}
    return None


def save(path, figures):
    with open(path, "w") as file:
        json.dump(figures, file, indent=2)
    return figures


def train_vocabulary(python, source, target, vocabulary, vocabulary_size, pairs, work):
    """`prepare` without --vocabulary, on the smallest corpus: the seconds
    until its "vocabulary:" line."""
    shutil.rmtree(vocabulary, ignore_errors=True)
    run = timed_command(
        [*python, "prepare", "--source", source, "--target", target, "--output", vocabulary,
         "--vocabulary-size", str(vocabulary_size)],
        os.path.join(work, "vocabulary.log"), stop_at="vocabulary:",
    )
    return save(os.path.join(work, "vocabulary.json"), {
        "pairs": pairs, "vocabulary_size": vocabulary_size,
        "seconds_to_vocabulary_line": arrival(run["lines"], "vocabulary:"),
        "command_seconds": run["seconds"],
    })


def prepare(python, source, target, vocabulary, prepared, pairs, folder):
    """`prepare --vocabulary`: its wall time and peak memory."""
    shutil.rmtree(prepared, ignore_errors=True)
    run = timed_command(
        [*python, "prepare", "--source", source, "--target", target, "--output", prepared,
         "--vocabulary", vocabulary],
        os.path.join(folder, "prepare.log"),
    )
    with open(os.path.join(prepared, "manifest.json")) as file:
        manifest = json.load(file)
    return save(os.path.join(folder, "prepare.json"), {
        "seconds": run["seconds"],
        "loop_seconds": manifest["seconds"],  # prepare_dataset alone, from the manifest
        "sentences_per_second_per_core": round(pairs * 2 / run["seconds"] / os.cpu_count()),
        "pairs_per_second": round(pairs / run["seconds"]),
        "loop_pairs_per_second": round(pairs / max(manifest["seconds"], 0.1)),
        "peak_rss_mb": run["peak_rss_mb"],
        "peak_anon_mb": run["peak_anon_mb"],
        "prepared_bytes": sum(os.path.getsize(os.path.join(prepared, name)) for name in os.listdir(prepared)),
        "target_tokens": manifest["target_tokens"],
    })


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.5, 4.5, 36], help="millions of pairs")
    parser.add_argument("--backends", nargs="+", default=["tensorflow"], choices=["tensorflow", "jax", "torch"])
    parser.add_argument("--data-dir", default=DEFAULT_DATA, help="holds train.en, train.de, val.en, val.de")
    parser.add_argument("--work", default=os.path.join(REPO, "runs", "data_scale"), help="where corpora and runs go")
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--loader-tokens", type=int, nargs="+", default=[25000, 4096], help="tokens_per_batch of the loader")
    parser.add_argument("--loader-batches", type=int, default=200)
    parser.add_argument("--drop-page-cache", action="store_true",
                        help="empty the page cache before each loader run (Linux, as root): its first pass is then cold")
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "results", "data_scale.json"))
    parser.add_argument("--plot", default=os.path.join(REPO, "benchmarks", "results", "data_scale.png"))
    parser.add_argument("--reuse-prepared", action="store_true",
                        help="keep the vocabulary and prepared sets of a former run in --work, and its prepare figures")
    parser.add_argument("--loader", metavar="DIR", help="only time the loader on this prepared set, in this process")
    args = parser.parse_args()
    if args.loader:
        for tokens in args.loader_tokens:
            measure_loader(args.loader, tokens, args.loader_batches)
        return

    python = [sys.executable, "-m", "keras_transformer"]
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    report = {
        "command": " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
        "train_steps": args.train_steps,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "load_average_at_start": os.getloadavg(),
        "backends": args.backends,
        "targets": TARGETS,
        "sizes": [],
    }
    pairs_of = [round(size * 1e6) for size in args.sizes]
    folders = [os.path.join(work, f"pairs_{pairs}") for pairs in pairs_of]
    vocabulary = os.path.join(work, "vocabulary")

    for index, (pairs, folder) in enumerate(zip(pairs_of, folders)):
        started = time.perf_counter()
        source, target = repeated_corpus(args.data_dir, folder, pairs)
        print(f"{pairs:,} pairs: text in {folder} ({time.perf_counter() - started:.0f}s)", flush=True)
        if index == 0:
            report["vocabulary"] = reused(os.path.join(work, "vocabulary.json"), args.reuse_prepared) or train_vocabulary(
                python, source, target, vocabulary, args.vocabulary_size, pairs, work
            )
            print(f"vocabulary: {report['vocabulary']}", flush=True)
        prepared = os.path.join(folder, "prepared")
        row = {
            "pairs": pairs,
            "text_bytes": os.path.getsize(source) + os.path.getsize(target),
            "prepare": reused(os.path.join(folder, "prepare.json"), args.reuse_prepared)
            or prepare(python, source, target, vocabulary, prepared, pairs, folder),
            "train": {},
        }
        print(f"{pairs:,} pairs: prepare {row['prepare']}", flush=True)

        for backend in args.backends:
            model_dir = os.path.join(folder, f"train_{backend}")
            shutil.rmtree(model_dir, ignore_errors=True)
            steps = str(args.train_steps)
            run = timed_command(
                [*python, "train", "--train-data", prepared, "--model-dir", model_dir,
                 "--valid-source", os.path.join(args.data_dir, "val.en"),
                 "--valid-target", os.path.join(args.data_dir, "val.de"),
                 "--preset", "tiny", "--train-steps", steps, "--checkpoint-every", steps,
                 "--valid-bleu-sentences", "0", "--log-every", "1"],
                os.path.join(folder, f"train_{backend}.log"), env={"KERAS_BACKEND": backend}, stop_at="step 1/",
            )
            row["train"][backend] = {
                "peak_rss_mb": run["peak_rss_mb"],
                "peak_anon_mb": run["peak_anon_mb"],
                "peak_file_mb": run["peak_file_mb"],
                "first_step_seconds": arrival(run["lines"], "step 1/"),
                "seconds": run["seconds"],
                "until_step_1": run["lines"],
            }
            print(f"{pairs:,} pairs: train, {backend}: peak {run['peak_rss_mb']} MB (anonymous "
                  f"{run['peak_anon_mb']}, mapped files {run['peak_file_mb']}), "
                  f"step 1 after {row['train'][backend]['first_step_seconds']}s", flush=True)

        if args.drop_page_cache:
            drop_page_cache()
        loader = subprocess.run(
            [sys.executable, __file__, "--loader", prepared, "--loader-batches", str(args.loader_batches),
             "--loader-tokens", *map(str, args.loader_tokens)],
            cwd=REPO, capture_output=True, text=True, check=True,
        )
        row["loader"] = [json.loads(line) for line in loader.stdout.splitlines() if line.startswith("{")]
        for result in row["loader"]:
            print(f"{pairs:,} pairs: loader at {result['tokens_per_batch']} tokens a batch: "
                  f"{result['target_tokens_per_second']:,} target tokens/s, "
                  f"{result['cached_target_tokens_per_second']:,} from the page cache", flush=True)
        report["sizes"].append(row)

    first, last = report["sizes"][0], report["sizes"][-1]
    report["checks"] = {
        backend: {
            "peak_largest/smallest": round(last["train"][backend]["peak_rss_mb"] / first["train"][backend]["peak_rss_mb"], 2),
            "peak_largest_mb": last["train"][backend]["peak_rss_mb"],
            "first_step_largest_seconds": last["train"][backend]["first_step_seconds"],
        }
        for backend in args.backends
    } | {
        "loader_slowest_tokens_per_second": min(r["target_tokens_per_second"] for row in report["sizes"] for r in row["loader"]),
        "loader_slowest_cached_tokens_per_second": min(
            r["cached_target_tokens_per_second"] for row in report["sizes"] for r in row["loader"]
        ),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as file:
        json.dump(report, file, indent=2)
        file.write("\n")
    plot(report, args.plot)

    cores = os.cpu_count()
    print(f"\n{report['machine']['cpu']}, {cores} cores; vocabulary of {args.vocabulary_size} pieces from "
          f"{report['vocabulary']['pairs']:,} pairs: {report['vocabulary']['seconds_to_vocabulary_line']}s")
    header = ["pairs", "prepare s", "sentences/s/core", "prepare peak MB"]
    for backend in args.backends:
        header += [f"train peak MB (anonymous), {backend}", f"step 1 after s, {backend}"]
    header += [f"loader tokens/s at {tokens}, first pass / cached" for tokens in args.loader_tokens]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in report["sizes"]:
        cells = [f"{row['pairs'] / 1e6:g}M", f"{row['prepare']['seconds']:.1f}",
                 f"{row['prepare']['sentences_per_second_per_core']:,}", f"{row['prepare']['peak_rss_mb']:,.0f}"]
        for backend in args.backends:
            run = row["train"][backend]
            cells += [f"{run['peak_rss_mb']:,.0f} ({run['peak_anon_mb']:,.0f})", f"{run['first_step_seconds']:.1f}"]
        cells += [
            f"{r['target_tokens_per_second'] / 1e6:.2f}M / {r['cached_target_tokens_per_second'] / 1e6:.2f}M"
            for r in row["loader"]
        ]
        print("| " + " | ".join(cells) + " |")
    print(f"checks: {json.dumps(report['checks'])}")
    print(f"wrote {args.json} and {args.plot}")


if __name__ == "__main__":
    main()
