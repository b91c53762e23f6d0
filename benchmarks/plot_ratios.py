"""The main training-speed ratios as one PNG, from the benchmarks' JSON results.

    python benchmarks/plot_ratios.py [--results benchmarks/results] [--out benchmarks/results/cpu_ratios.png] \
        [--prefer metrics --prefer zen5]

Reads what is there of:
- `cpu_<backend>_small_float32.json` (`training_speed.py`): ours / keras-hub
  and ours / torch.nn.Transformer, per Keras backend;
- `cpu_tensorflow_base_float32.json`: our model FLOPs utilisation at base;
- `precision_<backend>.json` (`precision.py`): mixed_bfloat16 / float32;
- `bucketing_tensorflow.json` (`bucketing.py`): bucketed / padded batches.

`--prefer SUFFIX` (repeatable, first wins) reads `<name>_SUFFIX.json` in
place of `<name>.json` where it exists, so that the plot can show the latest
run of each benchmark while the older reports stay beside it. Each bar is a
ratio measured in one run; the line on it is the target.
"""

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("tensorflow", "jax", "torch")


def collect(folder, prefer=()):
    """(label, value, target) for each ratio found, in display order."""
    bars = []

    def load(name):
        stem = name[: -len(".json")]
        for candidate in [f"{stem}_{suffix}.json" for suffix in prefer] + [name]:
            path = os.path.join(folder, candidate)
            if os.path.exists(path):
                print(f"{name}: reading {candidate}")
                with open(path) as file:
                    return json.load(file)
        return None

    for backend in BACKENDS:
        report = load(f"cpu_{backend}_small_float32.json")
        if report and "ours/keras_hub" in report["ratios"]:
            bars.append((f"ours / keras-hub, small fp32, {backend}", report["ratios"]["ours/keras_hub"], 1.0))
    for backend in BACKENDS:
        report = load(f"cpu_{backend}_small_float32.json")
        if report and "ours/torch" in report["ratios"]:
            bars.append((f"ours / torch.nn.Transformer, small fp32, {backend}", report["ratios"]["ours/torch"], None))
    report = load("cpu_tensorflow_base_float32.json")
    if report:
        bars.append(("ours, share of fp32 matmul peak, base, tensorflow", report["contenders"]["ours"]["mfu"], 0.75))
    for backend in BACKENDS:
        report = load(f"precision_{backend}.json")
        if report:
            bars.append((f"mixed_bfloat16 / float32, Multi30k, {backend}", report["mixed_bfloat16/float32"], 1.5))
    report = load("bucketing_tensorflow.json")
    if report:
        bars.append(("bucketed / padded batches, Multi30k, tensorflow", report["bucketed/padded"], 1.3))
    return bars


def plot(bars, path, title):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 0.45 * len(bars) + 1.2))
    axes = figure.add_subplot()
    positions = range(len(bars))[::-1]
    values = [value for _, value, _ in bars]
    colours = [
        "tab:gray" if target is None else ("tab:green" if value >= target else "tab:red")
        for _, value, target in bars
    ]
    axes.barh(list(positions), values, color=colours)
    for position, (_, value, target) in zip(positions, bars):
        axes.text(max(value, target or 0), position, f" {value:.3g}", va="center")
        if target is not None:
            axes.plot([target, target], [position - 0.4, position + 0.4], color="black", linewidth=2)
    axes.set_yticks(list(positions), [label for label, _, _ in bars])
    axes.set_xlim(0, max(values + [1.5]) * 1.15)
    axes.set_xlabel("ratio (black line: target; green: met, red: missed, grey: no target)")
    axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(HERE, "results"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "cpu_ratios.png"))
    parser.add_argument("--title", default="Training speed on this project's 2-core CPU")
    parser.add_argument("--prefer", action="append", default=[], metavar="SUFFIX",
                        help="read <name>_SUFFIX.json where it exists (repeatable, first wins)")
    args = parser.parse_args()
    bars = collect(args.results, args.prefer)
    if not bars:
        parser.error(f"no benchmark results in {args.results}")
    plot(bars, args.out, args.title)
    for label, value, target in bars:
        print(f"{label}: {value:.2f}" + ("" if target is None else f" (target {target})"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
