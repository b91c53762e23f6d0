"""The host's time per training step under Keras's torch backend, beside
`torch.nn.Transformer`'s, on the CPU.

    KERAS_BACKEND=torch python benchmarks/torch_host_time.py

On a GPU, eager torch runs a step one operation at a time, and the GPU
waits while the host prepares the next (issue 45: ours trained at 0.54x
`torch.nn.Transformer` on an H200, 0.79x once this host work was cut). This measures that host work where no
GPU is: both models at the base preset's 6 + 6 layers but tiny widths
(d_model 16, 2 heads, 100 ids, 2 sentences of 8 tokens), so that the
arithmetic is next to nothing and a step's time is the Python and dispatch
around its operations. torch's Adam runs with `foreach=True`, as it does on
a GPU (on a CPU its default is a loop over the parameters). torch uses one
thread, as the host's dispatch does. `--precision mixed_bfloat16` runs ours
under Keras's policy and theirs under torch's autocast, as on a GPU.

The two take turns, `--rounds` times, each training `--steps` steps with
the contenders of `training_speed.py` (ours with `fit`, timed inside it).
Printed: ms per step of each (its fastest turn: on a shared machine the
others include other programs' time), ours / theirs as
a speed ratio, and counts of one step's host work that do not vary with
the machine's load: the torch operations it dispatches, those of them that
compute (a kernel each on a GPU; not views or bare allocations), and the
Python and built-in function calls it makes.
"""

import argparse
import json
import sys

import training_speed as speed

SIZE = {"num_layers": 6, "d_model": 16, "num_heads": 2, "vocabulary_size": 100, "batch_size": 2, "length": 8}


def dispatched_operations(step):
    """The torch operations that `step()` dispatches: all of them, and
    those that compute, neither views nor bare allocations nor host
    scalars (on a GPU, each of these is a kernel to launch)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    no_kernel = {aten.empty.memory_format, aten.empty_strided.default, aten._unsafe_view.default, aten.scalar_tensor.default}

    class Count(TorchDispatchMode):
        operations = 0
        computing = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.operations += 1
            self.computing += not (func.is_view or func in no_kernel)
            return func(*args, **(kwargs or {}))

    with Count() as count:
        step()
    return count.operations, count.computing


def function_calls(run):
    """The Python and built-in (C) function calls that `run()` makes."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps a turn (at least 2)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default="float32",
                        help="mixed_bfloat16: ours under Keras's policy, theirs under torch's autocast")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    import keras
    import torch

    if keras.backend.backend() != "torch":
        sys.exit(f"error: this measures Keras's torch backend; KERAS_BACKEND is {keras.backend.backend()!r}")
    if args.steps < 2:
        sys.exit(f"error: --steps must be at least 2 (a step's function calls are a turn of 2 less a turn of 1); received {args.steps}")
    torch.set_num_threads(1)
    batches = speed.random_data(SIZE, args.steps)
    model = speed.our_model(SIZE, dtype=args.precision)
    speed.compile_model(model, warmup_steps=speed.WARMUP_STEPS, label_smoothing=speed.LABEL_SMOOTHING)
    ours = speed.KerasContender("ours", model, batches)
    theirs = speed.TorchContender(SIZE, args.precision, batches)
    theirs.optimizer = torch.optim.Adam(theirs.model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    contenders = [ours, theirs]
    for contender in contenders:
        contender.train(2)  # builds, and takes the first calls' costs
    # A step's operations and calls: a turn of 2 steps less one of 1, which
    # cancels what a turn (ours: a `fit`) does once.
    counted = {
        contender.name: [
            two - one
            for two, one in zip(
                dispatched_operations(lambda: contender.train(2)), dispatched_operations(lambda: contender.train(1))
            )
        ]
        for contender in contenders
    }
    operations = {name: pair[0] for name, pair in counted.items()}
    computing = {name: pair[1] for name, pair in counted.items()}
    calls = {
        contender.name: function_calls(lambda: contender.train(2)) - function_calls(lambda: contender.train(1))
        for contender in contenders
    }
    times = {"ours": [], "torch": []}
    for round_ in range(args.rounds):
        for contender in contenders[round_ % 2 :] + contenders[: round_ % 2]:
            times[contender.name].append(1000 * contender.train(args.steps) / args.steps)
    # The fastest turn: on a shared CPU the slow turns are other work's.
    ms = {name: min(values) for name, values in times.items()}
    report = {
        "size": SIZE,
        "precision": args.precision,
        "ms_per_step": ms,
        "ours_speed_over_torch": ms["torch"] / ms["ours"],
        "operations_per_step": operations,
        "computing_operations_per_step": computing,
        "function_calls_per_step": calls,
        "microseconds_per_operation": {name: 1000 * ms[name] / operations[name] for name in ms},
        "versions": speed.versions(),
    }
    for name in ("ours", "torch"):
        print(f"{name:6s} {ms[name]:6.1f} ms a step, {operations[name]:5d} torch operations "
              f"({computing[name]:5d} computing), "
              f"{report['microseconds_per_operation'][name]:5.1f} us each, {calls[name]:6d} function calls")
    print(f"ours / torch.nn.Transformer, speed: {report['ours_speed_over_torch']:.2f}x")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
