"""A digest of the decoding programs a tree compiles, to compare two trees.

    KERAS_BACKEND=jax python benchmarks/compiled_programs.py
    python benchmarks/before_after.py --before HEAD~3 --programs

For the small and base presets (vocabulary 8,000, seeded weights), batch
32, greedy and beam 4, the search that `Translator` compiles is traced and
summarised:

- JAX: the StableHLO text of the `jax.jit` function, without source
  locations, as a SHA-256 and a line count;
- TensorFlow with XLA: the count of each operation type in the traced
  graph and its functions;
- torch: the count of each operation kind in the loops' `torch.jit`
  traces.

Two trees whose digests agree run the same program: their speeds differ
only by the machine's noise (under torch, by the Python around the traces
too).
"""

import collections
import hashlib
import json
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.decoding import search_translations  # noqa: E402
from keras_transformer.decoding.compiled import CompiledFunction  # noqa: E402


def digest(preset, beam_size):
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(preset, vocabulary_size=8000)

    # `**options`: the `decoding` argument, which a revision from before it
    # existed does not pass (before_after.py --programs runs this on both).
    def search(source, limit, **options):
        return search_translations(
            model, source, limit, beam_size=beam_size, alpha=0.6, max_extra_length=19, bos_id=2, eos_id=-1,
            **options,
        )

    backend = keras.backend.backend()
    compiled = CompiledFunction(search, model, [2, 1], jit_compile=backend == "tensorflow")
    source = np.random.default_rng(0).integers(4, 8000, (32, 21)).astype("int32")
    limits = np.full((32,), 40, "int32")
    if backend == "jax":
        jitted = next(cell.cell_contents for cell in compiled._call.__closure__ if hasattr(cell.cell_contents, "lower"))
        inputs = [keras.ops.convert_to_tensor(x) for x in (source, limits)]
        text = jitted.lower([v.value for v in model.variables], *inputs).as_text()
        text = re.sub(r"#loc[^\n]*\n", "", re.sub(r" loc\([^\n]*\)", "", text))
        return {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16], "lines": len(text.splitlines())}
    if backend == "tensorflow":
        inputs = [keras.ops.convert_to_tensor(x) for x in (source, limits)]
        graph = compiled._call.get_concrete_function(*inputs).graph.as_graph_def()
        nodes = list(graph.node) + [node for function in graph.library.function for node in function.node_def]
        return dict(sorted(collections.Counter(node.op for node in nodes).items()))
    compiled(source, limits)
    kinds = collections.Counter()
    for traced, _ in compiled.loops._traces.values():
        kinds.update(node.kind() for node in traced.graph.nodes())
    return dict(sorted(kinds.items()))


def main():
    results = {
        f"{preset} {'greedy' if beam_size == 1 else 'beam 4'}": digest(preset, beam_size)
        for preset in ("small", "base")
        for beam_size in (1, 4)
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
