"""Training speed of our Transformer beside keras-hub's and torch's, in one process.

    KERAS_BACKEND=jax python benchmarks/training_speed.py --size small \
        --precision mixed_bfloat16 --out benchmarks/results/speed.json

The contenders, all of the same size, train on the same batches: random
token ids of one length, or with `--corpus SOURCE TARGET` a parallel
corpus's sentences, tokenized and bucketed as `keras-transformer train`
does (about 25,000 padded tokens a side per batch, as in the paper;
`--tokens-per-batch`, `--buckets`):

    KERAS_BACKEND=jax python benchmarks/training_speed.py --size base \
        --precision mixed_bfloat16 --corpus train.en train.de

- `ours`: `build_transformer`, compiled with `training.compile_model` (the
  paper's Adam, schedule and label smoothing), trained with `fit`;
- `keras_hub`: the same architecture built from keras-hub's
  `TransformerEncoder` and `TransformerDecoder` (shared embeddings, sinusoidal
  positions, post-LN), compiled and trained the same way; skipped with the
  reason printed when keras-hub does not import;
- `torch`: `torch.nn.Transformer` with a shared embedding, the same loss and
  Adam, in eager PyTorch (autocast for mixed_bfloat16); skipped when torch
  does not import. It runs whatever the Keras backend;
- `ours_steps_per_execution` (asked for by name): ours compiled with
  Keras's `steps_per_execution` (`--steps-per-execution`, 8), which runs
  that many steps per call of the train function and reads the logs once;
- `ours_xla_attention` (asked for by name, JAX): ours with XLA's attention
  where a GPU would run cuDNN's fused kernel, to measure one against the other;
- `ours_other_products` (asked for by name, torch on a CPU): ours with
  the float32 products the package's rule does not pick on this CPU
  (`keras_transformer/backend/products.py`): torch's own `matmul` where it
  picks oneDNN's, oneDNN's where it picks torch's, to show what the rule
  buys;
- `ours_accumulate` (asked for by name): ours compiled with
  `accumulate=--accumulate` (4): one update every 4 batches, each batch's
  loss weighed by its share of the update's target tokens, as
  `keras-transformer train --accumulate 4` trains; beside `ours` on the
  same batches, it shows what accumulating costs in speed and memory;
- `ours_jit` (asked for by name): ours compiled with `jit_compile=True`,
  which is `torch.compile` of the train step under torch and XLA under
  TensorFlow (JAX always compiles with XLA), beside `ours` with
  `--jit-compile`'s setting, so that one run shows what compiling gives.

`--jit-compile` (`auto`, Keras's choice, by default) sets `ours` and
`keras_hub` alike.

After a warm-up (whose first step, compilation included, is timed on its
own), the contenders take turns, `--rounds` times, each training `--steps`
steps per turn; the order rotates every round, so that the machine's drift
falls on all of them alike. Each turn starts after `--settle` idle seconds
and one untimed step: without them, the contender after
`torch.nn.Transformer` (always the same one, as the order rotates) shared
the cores with the thread pool that torch left spinning, and ran up to a
quarter slower. A turn is timed from the start of its first step to the
device finishing its last (for the Keras contenders, inside `fit`: its
setup and teardown are not counted). Reported per contender: target
tokens per second (the median over turns), the warm-up, the peak memory,
and the model FLOPs utilisation: the
matmul FLOPs of a training step (forward 2*m*n*k per matmul, attention scores
and values and the output projection included; backward twice the forward)
per second, over the matmul rate measured in the same run with a large
matmul in the same dtype through the same framework. With a corpus, the
FLOPs are those of the padded batches the device computes, and again of
the sentences at their own lengths ("without padding"); target tokens
are the real ones. `--size tiny` with
`--steps 1 --rounds 1` is the smoke test's seconds-long run.

`--profile` then traces one more turn of each contender and prints where
its time went. Under JAX (the Keras contenders) and torch (every one,
`torch.profiler`): the GPU's kernel time by kind (matmuls, fused
attention, the rest of XLA's fusions, scatters, copies), the kernels that
took longest, and the GPU's idle time with the host's work in its longest
gaps; under JAX also the time of XLA's operations per part of the model
(attention, layer norm, dropout, loss, Adam, ..., forward and backward,
from the optimized modules XLA writes for it), on a GPU or, on a CPU, in
thread-seconds. Under TensorFlow (the Keras contenders, `tf.profiler`):
the thread-seconds a step of its operations by part (matmuls, Adam, loss,
layer norm, dropout, the rest) on the CPU:

    KERAS_BACKEND=tensorflow python benchmarks/training_speed.py --size base --contenders --steps 4 --rounds 2 --profile

`--plot` trains nothing: it draws the training ratios of the reports in
`--results` (this tool's `cpu_<backend>_small_float32.json` and
`cpu_tensorflow_base_float32.json`, `precision.py`'s
`precision_<backend>.json`, `input_pipeline.py --bucketing`'s
`bucketing_tensorflow.json`) as one PNG, each bar with its target;
`--prefer SUFFIX` reads `<name>_SUFFIX.json` in place of `<name>.json`
where it exists (repeatable, first wins):

    python benchmarks/training_speed.py --plot --prefer zen5 --out benchmarks/results/cpu_ratios.png
"""

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
import types

# JAX takes 75% of the GPU when it starts; leave room for the torch
# contender, which runs in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
# torch's OpenMP threads busy-wait between operations by default. On a CPU,
# in one process with TensorFlow or JAX, they then spin against that
# framework's threads: on 2 cores our model under TensorFlow trained at half
# its speed once the torch contender had run. As the package does under the
# torch backend, they sleep instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SIZES = {
    # Not a preset: the contenders' common ground is one layer count for
    # both stacks and d_ff = 4 * d_model.
    "tiny": {"num_layers": 1, "d_model": 32, "num_heads": 2, "vocabulary_size": 100,
             "batch_size": 2, "length": 8},
    "small": {"num_layers": 3, "d_model": 256, "num_heads": 4, "vocabulary_size": 8000,
              "batch_size": 64, "length": 32},
    "base": {"num_layers": 6, "d_model": 512, "num_heads": 8, "vocabulary_size": 32000,
             "batch_size": 32, "length": 32},
}
DROPOUT = 0.1
LABEL_SMOOTHING = 0.1
HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP_STEPS = 4000
FIRST_ID = 4  # ids below are padding and special tokens


def import_package():
    """`build_transformer` and `compile_model`, also where TensorFlow is absent.

    The package's `__init__` imports the TensorFlow input pipeline; the model
    and `compile_model` need Keras alone. Without TensorFlow (the GPU machine
    this project is lent has none), the two modules are imported from a bare
    package object instead.
    """
    try:
        import keras_transformer as kt

        return kt.build_transformer, kt.training.compile_model
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("tensorflow"):
            raise
    import importlib.util

    root = importlib.util.find_spec("keras_transformer").submodule_search_locations[0]
    for name in [n for n in sys.modules if n.split(".")[0] == "keras_transformer"]:
        del sys.modules[name]
    for name in ("keras_transformer", "keras_transformer.training"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *name.split(".")[1:])]
        sys.modules[name] = package
    from keras_transformer.models import build_transformer
    from keras_transformer.training.trainer import compile_model

    return build_transformer, compile_model


build_transformer, compile_model = import_package()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _support import other_products  # noqa: E402
from _support import step_times  # noqa: E402


def matmul_flops(num_layers, d_model, vocabulary_size, batch_size, length, source_length=None, **_):
    """Matmul FLOPs of one training step: 3x the forward pass (backward = 2x).

    Per attention of `queries` positions over `keys` positions: the Q and
    output projections (2 * q * d * d each), the K and V projections
    (2 * k * d * d each), the scores QK^T and the weighted values
    (2 * q * k * d each). The causal mask is not subtracted: the full T x T
    scores are computed. Embedding lookups are gathers, not counted.
    `length` is the target's; the source's is the same unless given.
    """
    d, d_ff = d_model, 4 * d_model
    source = length if source_length is None else source_length

    def attention(queries, keys):
        return 2 * batch_size * (2 * queries * d * d + 2 * keys * d * d + 2 * queries * keys * d)

    def feed_forward(positions):
        return 2 * 2 * batch_size * positions * d * d_ff

    encoder = attention(source, source) + feed_forward(source)
    decoder = attention(length, length) + attention(length, source) + feed_forward(length)
    logits = 2 * batch_size * length * d * vocabulary_size
    return 3 * (num_layers * (encoder + decoder) + logits)


def batch_flops(size, inputs, labels):
    """(FLOPs of the padded batch as the device runs it, FLOPs of its
    sentences at their own lengths): the second leaves padding out."""
    rows, length = labels.shape
    architecture = {key: size[key] for key in ("num_layers", "d_model", "vocabulary_size")}
    padded = matmul_flops(**architecture, batch_size=rows, length=length,
                          source_length=inputs["source_ids"].shape[1])
    real = sum(
        matmul_flops(**architecture, batch_size=1, length=int(t), source_length=int(s))
        for s, t in zip((inputs["source_ids"] != 0).sum(1), (labels != 0).sum(1))
    )
    return padded, real


# === The backend: device, synchronisation, memory ===


def keras_device():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.devices()[0].platform, jax.devices()[0].device_kind
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return "gpu", torch.cuda.get_device_name(0)
        return "cpu", platform.processor() or "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return "gpu", tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    return "cpu", platform.processor() or "cpu"


def wait_for(tensor):
    """Blocks until the device has computed `tensor`, reading one element."""
    keras.ops.convert_to_numpy(keras.ops.reshape(tensor, (-1,))[:1])


class PeakMemory:
    """The peak of a contender's allocator, as far as each framework can say.

    The peak is that of the whole allocator: it includes the weights and
    optimizer state of the other contenders on the same allocator, since all
    are built before the first warm-up. torch and TensorFlow GPUs reset it
    before each contender's turn; JAX cannot reset its, so its figure is the
    process's peak up to the end of that contender's turns; on a CPU, the
    process's maximum resident set, likewise cumulative.
    """

    def __init__(self, framework, device):
        self.framework = framework
        self.device = device

    @property
    def note(self):
        if self.device != "gpu":
            return "process max RSS (cumulative)"
        if self.framework == "jax":
            return "JAX peak_bytes_in_use (cumulative: JAX cannot reset it)"
        if self.framework == "torch":
            return "torch.cuda.max_memory_allocated (reset per contender)"
        return "TensorFlow GPU peak (reset per contender)"

    def reset(self):
        if self.device != "gpu":
            return
        if self.framework == "torch":
            import torch

            torch.cuda.reset_peak_memory_stats()
        elif self.framework == "tensorflow":
            import tensorflow as tf

            tf.config.experimental.reset_memory_stats("GPU:0")

    def read(self):
        if self.device != "gpu":
            # ru_maxrss is in KiB on Linux, in bytes on macOS.
            scale = 1 if sys.platform == "darwin" else 1024
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        if self.framework == "jax":
            import jax

            return (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        if self.framework == "torch":
            import torch

            return torch.cuda.max_memory_allocated()
        import tensorflow as tf

        return tf.config.experimental.get_memory_info("GPU:0")["peak"]


def timed_matmul_rate(multiply, make_operand, wait, size, repeats, rounds=5):
    """FLOP/s of `size`^3 matmuls, the median of `rounds` runs of `repeats`."""
    a, b = make_operand(size, 0), make_operand(size, 1)
    wait(multiply(a, b))
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            product = multiply(a, b)
        wait(product)
        rates.append(2 * size**3 * repeats / (time.perf_counter() - start))
    return statistics.median(rates)


def keras_matmul_rate(dtype, size, repeats):
    def make_operand(size, seed):
        return keras.random.normal((size, size), dtype=dtype, seed=seed)

    return timed_matmul_rate(keras.ops.matmul, make_operand, wait_for, size, repeats)


# === Contenders ===


def update_weights(batches, accumulate):
    """Each batch's loss weight for updates of `accumulate` batches: that
    many times its share of its update's target tokens, per token."""
    tokens = np.array([int((labels != 0).sum()) for _, labels in batches], np.float64)
    weights = []
    for start in range(0, len(batches), accumulate):
        group = tokens[start : start + accumulate]
        for (_, labels), count in zip(batches[start : start + accumulate], group):
            weights.append(np.full(labels.shape, len(group) * count / max(group.sum(), 1.0), np.float32))
    return weights


class KerasContender:
    """A compiled Keras model, trained with `fit` on fixed batches (with
    `accumulate` above 1, each with its loss weights)."""

    def __init__(self, name, model, batches, context=contextlib.nullcontext, accumulate=1):
        self.name = name
        self.model = model
        self.weights = update_weights(batches, accumulate) if accumulate > 1 else None
        self.batches = batches
        self.context = context  # around each `fit`, where steps are traced
        shapes = {labels.shape for _, labels in batches}
        # Batches of one shape go in as arrays, which `fit` slices itself;
        # real lengths one batch at a time, as the `train` command feeds them.
        self.arrays = None
        if len(shapes) == 1:
            self.arrays = (
                {key: np.concatenate([inputs[key] for inputs, _ in batches]) for key in batches[0][0]},
                np.concatenate([labels for _, labels in batches]),
            ) + ((np.concatenate(self.weights),) if self.weights is not None else ())
        self.parameters = model.count_params()
        self.jit_compile = model.jit_compile  # Keras's resolved setting

    def train(self, steps):
        """Trains on the first `steps` batches with one `fit`; returns the
        seconds they took.

        The steps are timed from the start of the first to the end of the
        last, which a callback marks once the step's logs (read on the host,
        so after the device finished) are there. What `fit` does before and
        after is not counted: under TensorFlow, the teardown of the `tf.data`
        pipeline that Keras makes of arrays can idle for seconds at the end.
        """
        with self.context():
            return self._train(steps)

    def _train(self, steps):
        timer = step_times()
        if self.arrays is not None:
            batch_size = len(self.batches[0][1])
            inputs, labels, *weights = self.arrays
            rows = steps * batch_size
            self.model.fit(
                {key: value[:rows] for key, value in inputs.items()}, labels[:rows],
                sample_weight=weights[0][:rows] if weights else None,
                batch_size=batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[timer],
            )
        else:
            # A generator, which our model's `fit` checks on the host as
            # it yields, as it does `train`'s batches (not in the step).
            batches = self.batches if self.weights is None else [(*b, w) for b, w in zip(self.batches, self.weights)]
            self.model.fit(
                (batch for batch in batches[:steps]), steps_per_epoch=steps,
                epochs=1, verbose=0, shuffle=False, callbacks=[timer],
            )
        return timer.ends[-1] - timer.first


def keras_hub_transformer(vocabulary_size, num_layers, d_model, num_heads, dtype):
    """Our architecture from keras-hub's layers, as a Functional model."""
    import keras_hub

    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_ids = keras.Input(shape=(None,), dtype="int32", name="target_ids")
    embedding = keras_hub.layers.ReversibleEmbedding(
        vocabulary_size, d_model, tie_weights=True, dtype=dtype, name="token_embedding"
    )
    position_encoding = keras_hub.layers.SinePositionEncoding(dtype=dtype)

    def embed(ids, name):
        x = embedding(ids) * math.sqrt(d_model)
        x = x + position_encoding(x)
        return keras.layers.Dropout(DROPOUT, dtype=dtype, name=f"{name}_dropout")(x)

    block_arguments = {
        "intermediate_dim": 4 * d_model,
        "num_heads": num_heads,
        "dropout": DROPOUT,
        "normalize_first": False,
        "layer_norm_epsilon": 1e-6,
        "dtype": dtype,
    }
    source_mask = keras.ops.not_equal(source_ids, 0)
    target_mask = keras.ops.not_equal(target_ids, 0)
    x = embed(source_ids, "source")
    for i in range(num_layers):
        x = keras_hub.layers.TransformerEncoder(**block_arguments, name=f"encoder_{i}")(
            x, padding_mask=source_mask
        )
    y = embed(target_ids, "target")
    for i in range(num_layers):
        y = keras_hub.layers.TransformerDecoder(**block_arguments, name=f"decoder_{i}")(
            y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask
        )
    logits = keras.ops.cast(embedding(y, reverse=True), "float32")
    model = keras.Model({"source_ids": source_ids, "target_ids": target_ids}, logits)
    # `compile_model` reads the schedule's d_model from the model.
    model.d_model = d_model
    return model


class TorchContender:
    """`torch.nn.Transformer` with a shared embedding, trained in eager mode."""

    def __init__(self, size, precision, batches):
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = "torch"
        self.jit_compile = None  # eager PyTorch
        self.model = _torch_transformer(size).to(self.device)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.autocast_dtype = torch.bfloat16 if precision == "mixed_bfloat16" else None
        d_model = size["d_model"]
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9
        )
        # The paper's schedule, as in `compile_model`.
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: d_model**-0.5 * min((step + 1) ** -0.5, (step + 1) * WARMUP_STEPS**-1.5),
        )
        self.batches = [
            tuple(torch.from_numpy(array).long() for array in (inputs["source_ids"], inputs["target_ids"], labels))
            for inputs, labels in batches
        ]

    def train(self, steps):
        """Trains on the first `steps` batches; returns the seconds they took."""
        torch = self.torch
        start = time.perf_counter()
        self.model.train()
        for batch in self.batches[:steps]:
            source, target, labels = (tensor.to(self.device, non_blocking=True) for tensor in batch)
            with torch.autocast(
                self.device, dtype=self.autocast_dtype or torch.float32,
                enabled=self.autocast_dtype is not None,
            ):
                logits = self.model(source, target)
            loss = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), labels.flatten(),
                label_smoothing=LABEL_SMOOTHING, ignore_index=0,
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.schedule.step()
        loss.item()
        return time.perf_counter() - start


def _torch_transformer(size):
    import torch

    class SharedEmbeddingTransformer(torch.nn.Module):
        def __init__(self, vocabulary_size, num_layers, d_model, num_heads, **_):
            super().__init__()
            self.d_model = d_model
            self.embedding = torch.nn.Embedding(vocabulary_size, d_model)
            torch.nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
            self.transformer = torch.nn.Transformer(
                d_model, num_heads, num_layers, num_layers, 4 * d_model,
                dropout=DROPOUT, batch_first=True, norm_first=False, layer_norm_eps=1e-6,
            )
            self.dropout = torch.nn.Dropout(DROPOUT)
            positions = torch.arange(512, dtype=torch.float32)[:, None]
            even = torch.arange(0, d_model, 2, dtype=torch.float32)
            angles = positions * 10000.0 ** (-even / d_model)
            encoding = torch.zeros(512, d_model)
            encoding[:, 0::2], encoding[:, 1::2] = torch.sin(angles), torch.cos(angles)
            self.register_buffer("encoding", encoding, persistent=False)

        def embed(self, ids):
            x = self.embedding(ids) * self.d_model**0.5 + self.encoding[: ids.shape[1]]
            return self.dropout(x)

        def forward(self, source_ids, target_ids):
            length = target_ids.shape[1]
            # Boolean, like the padding masks: True where attention is barred.
            causal = torch.ones(length, length, dtype=torch.bool, device=target_ids.device).triu(1)
            y = self.transformer(
                self.embed(source_ids), self.embed(target_ids), tgt_mask=causal,
                src_key_padding_mask=source_ids == 0, tgt_key_padding_mask=target_ids == 0,
                memory_key_padding_mask=source_ids == 0, tgt_is_causal=True,
            )
            return y @ self.embedding.weight.T

    return SharedEmbeddingTransformer(**size)


def torch_matmul_rate(precision, size, repeats):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if precision == "mixed_bfloat16" else torch.float32

    def make_operand(size, seed):
        generator = torch.Generator(device).manual_seed(seed)
        return torch.randn(size, size, device=device, dtype=dtype, generator=generator)

    def wait(product):
        product[0, 0].item()

    return timed_matmul_rate(torch.matmul, make_operand, wait, size, repeats)


def onednn_matmul_rate(size, repeats):
    """The float32 rate of torch's oneDNN linear operation on the CPU, which
    the package's layers use under torch (keras_transformer/backend/products.py),
    or None where torch or that operation is missing."""
    try:
        import torch

        from keras_transformer.backend import products as torch_products
    except ImportError:
        return None
    linear = torch_products.onednn_linear()
    if linear is None:
        return None

    def make_operand(size, seed):
        return torch.randn(size, size, generator=torch.Generator().manual_seed(seed))

    def wait(product):
        product[0, 0].item()

    return timed_matmul_rate(lambda a, b: linear(a, b.t()), make_operand, wait, size, repeats)


# === The benchmark ===


def optional_import(name):
    """(module, None) or (None, why it does not import)."""
    try:
        return __import__(name), None
    except Exception as error:  # any failure to import is a reason to skip
        return None, f"{name} does not import: {type(error).__name__}: {error}"


def our_model(size, dtype=None, dropout=DROPOUT):
    """`build_transformer` at `size`, as every contender is: d_ff = 4 * d_model."""
    architecture = {key: size[key] for key in ("vocabulary_size", "num_layers", "d_model", "num_heads")}
    return build_transformer("base", **architecture, d_ff=4 * size["d_model"], dropout=dropout, dtype=dtype)


def random_data(size, steps, seed=0):
    """`steps` batches of random token ids, `({"source_ids", "target_ids"},
    labels)`, each int32 `[batch_size, length]`, no padding."""
    rng = np.random.default_rng(seed)
    shape = (size["batch_size"], size["length"])

    def random_ids():
        return rng.integers(FIRST_ID, size["vocabulary_size"], shape).astype("int32")

    return [({"source_ids": random_ids(), "target_ids": random_ids()}, random_ids()) for _ in range(steps)]


def corpus_batches(source_path, target_path, tokens_per_batch, buckets, vocabulary_size=8000, seed=0):
    """A parallel corpus's endless `TokenBatches`, made as `keras-transformer
    train` makes them: a shared BPE vocabulary learned from the files, pairs
    of at most 256 tokens, `tokens_per_batch` padded tokens a side in at most
    `buckets` lengths, shuffled."""
    from keras_transformer.data.batches import TokenBatches
    from keras_transformer.data.prepared import read_pairs, tokenize_pairs
    from keras_transformer.data.tokenizer import SubwordTokenizer

    pairs = [pair for chunk in read_pairs([source_path], [target_path]) for pair in chunk]
    tokenizer = SubwordTokenizer.train(pairs, vocabulary_size, seed=seed)
    tokenized = tokenize_pairs([s for s, _ in pairs], [t for _, t in pairs], tokenizer)
    return TokenBatches(tokenized, tokens_per_batch, max_length=256, repeat=True, seed=seed, buckets=buckets)


def corpus_data(source_path, target_path, tokens_per_batch, buckets, steps, vocabulary_size=8000, seed=0):
    """The first `steps` batches of `corpus_batches`."""
    batches = corpus_batches(source_path, target_path, tokens_per_batch, buckets, vocabulary_size, seed)
    return [batches[index] for index in range(steps)]


def build_contenders(args, size, batches, skipped):
    """The contenders in turn order, with their build times."""
    dtype = None if args.precision == "float32" else args.precision
    architecture = {key: size[key] for key in ("vocabulary_size", "num_layers", "d_model", "num_heads")}
    built = []

    def keras_contender(
        name, make_model, jit_compile=args.jit_compile, context=contextlib.nullcontext, steps_per_execution=1,
        accumulate=1,
    ):
        start = time.perf_counter()
        with data_parallel_scope(args.data_parallel):
            model = make_model()
            compile_model(
                model, warmup_steps=WARMUP_STEPS, label_smoothing=LABEL_SMOOTHING, jit_compile=jit_compile,
                steps_per_execution=steps_per_execution, accumulate=accumulate,
            )
        contender = KerasContender(name, model, batches, context, accumulate=accumulate)
        built.append((contender, time.perf_counter() - start))

    keras_contender("ours", lambda: our_model(size, dtype))
    if "ours_accumulate" in args.contenders:
        keras_contender("ours_accumulate", lambda: our_model(size, dtype), accumulate=args.accumulate)
    if "ours_jit" in args.contenders:
        keras_contender("ours_jit", lambda: our_model(size, dtype), jit_compile=True)
    if "ours_steps_per_execution" in args.contenders:
        keras_contender(
            "ours_steps_per_execution", lambda: our_model(size, dtype), steps_per_execution=args.steps_per_execution
        )
    if "ours_xla_attention" in args.contenders:
        from keras_transformer.backend import attention

        keras_contender("ours_xla_attention", lambda: our_model(size, dtype), context=attention.xla_attention)
    if "ours_other_products" in args.contenders:
        keras_contender("ours_other_products", lambda: our_model(size, dtype), context=other_products)
    if "keras_hub" in args.contenders:
        keras_hub, reason = optional_import("keras_hub")
        if keras_hub is None:
            skipped["keras_hub"] = reason
        else:
            keras_contender("keras_hub", lambda: keras_hub_transformer(**architecture, dtype=dtype))
    if "torch" in args.contenders:
        torch, reason = optional_import("torch")
        if torch is None:
            skipped["torch"] = reason
        else:
            start = time.perf_counter()
            contender = TorchContender(size, args.precision, batches)
            built.append((contender, time.perf_counter() - start))
    return built


@contextlib.contextmanager
def data_parallel_scope(enabled):
    """The backend's data-parallel engine over every device, when asked:
    `keras.distribution.DataParallel` under JAX, `MirroredStrategy` under
    TensorFlow. Keras has none for torch."""
    backend = keras.backend.backend()
    if not enabled:
        yield
    elif backend == "jax":
        keras.distribution.set_distribution(keras.distribution.DataParallel())
        yield
    elif backend == "tensorflow":
        import tensorflow as tf

        with tf.distribute.MirroredStrategy().scope():
            yield
    else:
        raise ValueError(
            "--data-parallel needs KERAS_BACKEND=jax or tensorflow; Keras has "
            f"no data parallelism for {backend}."
        )


def memory_alone(args, name):
    """`ours`' or `ours_accumulate`'s peak memory trained in a process of
    its own (a CPU's max RSS counts every contender of the process): the
    peak while it trains a warm-up and `--steps` steps, in bytes."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [a for a in sys.argv[1:] if a not in ("--memory-alone",)]
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv, "--alone", name, "--out", out.name],
            capture_output=True, text=True, timeout=3600,
        )
        if child.returncode:
            raise RuntimeError(f"--alone {name} failed: {child.stderr[-2000:]}")
        return json.load(open(out.name))["peak_memory_bytes"]


def run_alone(args):
    """The child of `memory_alone`: one contender, trained; its peak."""
    size = dict(SIZES[args.size])
    if args.batch_size is not None:
        size["batch_size"] = args.batch_size
    batches = random_data(size, args.steps)
    args.contenders = [args.alone] if args.alone != "ours" else []
    (contender, _), *_ = [c for c in build_contenders(args, size, batches, {}) if c[0].name == args.alone]
    contender.train(1)
    contender.train(args.steps)
    return {"contender": args.alone, "peak_memory_bytes": PeakMemory(keras.backend.backend(), keras_device()[0]).read()}


def run(args):
    size = dict(SIZES[args.size])
    if args.batch_size is not None:
        size["batch_size"] = args.batch_size
    if args.corpus:
        batches = corpus_data(*args.corpus, args.tokens_per_batch, args.buckets, args.steps, args.corpus_vocabulary)
        # The corpus's ids folded into a smaller vocabulary (tiny's).
        vocabulary = size["vocabulary_size"]
        for inputs, labels in batches:
            for ids in (*inputs.values(), labels):
                ids[ids >= vocabulary] = FIRST_ID + ids[ids >= vocabulary] % (vocabulary - FIRST_ID)
    else:
        batches = random_data(size, args.steps)
    device, device_name = keras_device()
    keras_framework = keras.backend.backend()
    skipped = {}
    contenders = build_contenders(args, size, batches, skipped)
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")

    # The peak matmul rate, in the precision's compute dtype, per framework.
    # On a CPU a 1024^3 matmul reaches about 70% of the rate of a 4096^3 one.
    matmul_size, repeats = {"gpu": (8192, 10), "cpu": (4096, 2)}[device]
    if args.size == "tiny":
        matmul_size, repeats = 128, 2
    compute_dtype = "bfloat16" if args.precision == "mixed_bfloat16" else "float32"
    peak = {"keras": keras_matmul_rate(compute_dtype, matmul_size, repeats)}
    # On a GPU every contender is also measured against the bfloat16 rate,
    # the most the tensor cores give to any precision here.
    bfloat16_peak = None
    if device == "gpu":
        bfloat16_peak = peak["keras"] if compute_dtype == "bfloat16" else keras_matmul_rate(
            "bfloat16", matmul_size, repeats
        )
    if any(contender.name == "torch" for contender, _ in contenders):
        peak["torch"] = torch_matmul_rate(args.precision, matmul_size, repeats)
    # Under torch on the CPU the peak is the faster of torch's own product
    # (MKL) and oneDNN's, which our layers use there; on AMD CPUs oneDNN's
    # is about twice MKL's.
    uses_torch = [name for name in peak if name == "torch" or keras.backend.backend() == "torch"]
    if device == "cpu" and args.precision == "float32" and uses_torch:
        onednn = onednn_matmul_rate(matmul_size, repeats)
        if onednn is not None:
            peak["oneDNN through torch"] = onednn
            for name in uses_torch:
                peak[name] = max(peak[name], onednn)

    memory = {
        "keras": PeakMemory(keras_framework, device),
        "torch": PeakMemory("torch", device),
    }
    results = {}
    for contender, build_seconds in contenders:
        framework = "torch" if contender.name == "torch" else "keras"
        memory[framework].reset()
        start = time.perf_counter()
        contender.train(1)  # compiles, under JAX and TensorFlow
        first_step = time.perf_counter() - start
        contender.train(args.steps)  # the steady state, untimed
        results[contender.name] = {
            "framework": "torch" if framework == "torch" else keras_framework,
            "parameters": int(contender.parameters),
            "build_seconds": build_seconds,
            "first_step_seconds": first_step,
            "peak_memory_bytes": memory[framework].read(),
            "memory_note": memory[framework].note,
            "jit_compile": contender.jit_compile,
            "turn_seconds": [],
        }
    order = [contender for contender, _ in contenders]
    for turn in range(args.rounds):
        shift = turn % len(order)
        for contender in order[shift:] + order[:shift]:
            time.sleep(args.settle)
            contender.train(1)  # untimed: the previous contender's threads wind down
            framework = "torch" if contender.name == "torch" else "keras"
            memory[framework].reset()
            result = results[contender.name]
            result["turn_seconds"].append(contender.train(args.steps))
            peak_bytes = memory[framework].read()
            if peak_bytes is not None:
                result["peak_memory_bytes"] = max(result["peak_memory_bytes"] or 0, peak_bytes)

    # Per turn: the padded batches' FLOPs (what the device computes), their
    # sentences' own (padding left out), and the target tokens (labels).
    flops, real_flops = map(sum, zip(*(batch_flops(size, *batch) for batch in batches)))
    if args.profile:
        profile_turns(args, order, results, flops / args.steps)
    target_tokens = sum(int((labels != 0).sum()) for _, labels in batches)
    padded_tokens = sum(labels.size for _, labels in batches)
    for name, result in results.items():
        turn_seconds = statistics.median(result["turn_seconds"])
        framework = "torch" if name == "torch" else "keras"
        result["step_seconds"] = turn_seconds / args.steps
        result["target_tokens_per_second"] = target_tokens / turn_seconds
        result["flops_per_second"] = flops / turn_seconds
        result["mfu"] = flops / turn_seconds / peak[framework]
        result["mfu_without_padding"] = real_flops / turn_seconds / peak[framework]
        if bfloat16_peak is not None:
            result["mfu_of_bfloat16_peak"] = flops / turn_seconds / bfloat16_peak
    if args.memory_alone:
        for name in ["ours"] + [c for c in ("ours_accumulate",) if c in results]:
            results[name]["peak_memory_alone_bytes"] = memory_alone(args, name)
    ratios = {}
    if "peak_memory_alone_bytes" in results.get("ours_accumulate", {}):
        ratios["ours_accumulate/ours peak memory alone"] = (
            results["ours_accumulate"]["peak_memory_alone_bytes"] / results["ours"]["peak_memory_alone_bytes"]
        )
    others = ("ours_accumulate", "ours_jit", "ours_steps_per_execution", "ours_xla_attention", "ours_other_products", "keras_hub", "torch")
    for other in others:
        if other in results:
            ratios[f"ours/{other}"] = (
                results["ours"]["target_tokens_per_second"]
                / results[other]["target_tokens_per_second"]
            )
    return {
        "command": " ".join([f"KERAS_BACKEND={keras_framework}", "python", *sys.argv]),
        "size": args.size,
        "shape": size | {"d_ff": 4 * size["d_model"], "dropout": DROPOUT},
        "precision": args.precision,
        "keras_backend": keras_framework,
        "data_parallel": args.data_parallel,
        "jit_compile": args.jit_compile,
        "device": device,
        "device_name": device_name,
        "versions": versions(),
        "steps_per_turn": args.steps,
        "rounds": args.rounds,
        "matmul_flops_per_step": flops / args.steps,
        "data": corpus_note(args),
        "batch_shapes": sorted({(len(labels), inputs["source_ids"].shape[1], labels.shape[1]) for inputs, labels in batches}),
        "target_tokens_per_step": target_tokens / args.steps,
        "padding": 1 - target_tokens / padded_tokens,
        "peak_matmul_flops_per_second": peak,
        "peak_matmul_size": matmul_size,
        "bfloat16_peak_matmul_flops_per_second": bfloat16_peak,
        "contenders": results,
        "skipped": skipped,
        "ratios": ratios,
    }


def profile_turns(args, contenders, results, flops_per_step):
    """One more turn of each contender under a profiler. Under JAX (the
    Keras contenders) and torch (all of them): the GPU's kernel time by
    kind and its idle gaps, beside the turn's wall time; under JAX also
    XLA's operations by part of the model. Under TensorFlow (the Keras
    contenders): its operations by part of the model, in thread-seconds on
    the CPU."""
    import tempfile

    import _support

    backend = keras.backend.backend()
    for contender in contenders:
        if contender.name == "torch" and backend != "torch":
            continue
        directory = tempfile.mkdtemp(prefix=f"trace_{contender.name}_")
        contender.train(1)
        result = results[contender.name]
        try:
            if backend == "tensorflow":
                import tensorflow as tf

                tf.profiler.experimental.start(directory)
                try:
                    contender.train(args.steps)
                finally:
                    tf.profiler.experimental.stop()
            elif backend == "torch":
                with _support.torch_traced() as profiler:
                    seconds = contender.train(args.steps)
                summary = _support.torch_kernel_time(profiler)
            else:
                with _support.jax_traced(directory):
                    seconds = contender.train(args.steps)
                summary = _support.jax_kernel_time(directory)
        except Exception as error:  # a profiler that fails costs the trace, not the figures
            result["device_trace"] = {"error": f"{type(error).__name__}: {error}"}
            print(f"\n{contender.name}: no trace ({type(error).__name__}: {error})")
            continue
        print(f"\n{contender.name}, one traced turn of {args.steps} steps:")
        if backend == "tensorflow":
            result["tensorflow_parts"] = parts = _support.tensorflow_parts(directory, args.steps)
            print(tensorflow_parts_markdown(parts, flops_per_step))
            continue
        result["device_trace"] = summary and summary | {"wall_seconds": seconds}
        print("no GPU kernels in the trace" if summary is None else _support.kernel_markdown(summary, seconds, args.steps))
        if args.dump:
            times, programs = _support.jax_operation_time(directory)
            found = _support.module_of(times, _support.xla_operations(args.dump), programs)
            result["xla_parts"] = parts = _support.by_part(times, found)
            # Time in operations the module names: what the table can place.
            named = sum(seconds for operation, seconds in times.items() if operation in found)
            where = "on the GPU" if summary is not None else "thread-seconds on the CPU"
            print(f"\nXLA's operations by part of the model ({where}; {named / (sum(times.values()) or 1):.0%} "
                  "of their time in operations the optimized module names):")
            print(_support.parts_markdown(parts, args.steps))


def tensorflow_parts_markdown(parts, flops_per_step):
    """TensorFlow's thread-seconds a step by part, and the rate of the
    matmuls while they run."""
    total = sum(parts.values())
    if not total:
        return "no TensorFlow operations on the CPU's compute threads in the trace"
    lines = ["| part of the step | thread-s per step | share |", "| --- | ---: | ---: |"]
    lines += [f"| {part} | {seconds:.4f} | {seconds / total:.0%} |" for part, seconds in parts.items()]
    lines.append(f"| all | {total:.4f} | |")
    if parts.get("matmuls"):
        lines.append(f"\nmatmuls: {flops_per_step / parts['matmuls'] / 1e9:.0f} GFLOP/s per thread while they run")
    return "\n".join(lines)


def corpus_note(args):
    if not args.corpus:
        return "random ids, one length"
    return (f"the lengths of {os.path.basename(args.corpus[1])}, batched by TokenBatches "
            f"({args.tokens_per_batch:,} tokens a side, at most {args.buckets} lengths)")


def versions():
    found = {"python": platform.python_version(), "keras": keras.__version__}
    for name in ("jax", "torch", "tensorflow", "keras_hub"):
        module = sys.modules.get(name)
        if module is not None:
            found[name] = getattr(module, "__version__", "?")
    return found


def padding_note(padding):
    return "" if padding == 0 else f" ({padding:.0%} of the target side padding)"


def markdown_table(report):
    lines = [
        f"{report['size']}, {report['precision']}, Keras backend {report['keras_backend']}"
        f"{' (data parallel)' if report['data_parallel'] else ''}"
        f"{'' if report['jit_compile'] == 'auto' else ', jit_compile=' + str(report['jit_compile'])}, "
        f"{report['device_name']}; "
        f"{report['data']}: {report['target_tokens_per_step']:,.0f} target tokens per step"
        f"{padding_note(report['padding'])}, "
        f"{report['matmul_flops_per_step'] / 1e9:.1f} GFLOP per step; median of "
        f"{report['rounds']} turns of {report['steps_per_turn']} steps",
        "",
        "| contender | parameters | target tokens/s | ms/step | MFU | MFU without padding | MFU of bf16 peak | "
        "ours / this | first step (s) | peak memory (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, result in report["contenders"].items():
        ratio = report["ratios"].get(f"ours/{name}")
        memory = result["peak_memory_bytes"]
        lines.append(
            f"| {name} ({result['framework']}) | {result['parameters']:,} | "
            f"{result['target_tokens_per_second']:,.0f} | {result['step_seconds'] * 1000:.2f} | "
            f"{result['mfu']:.2%} | {result['mfu_without_padding']:.2%} | "
            f"{'n/a' if 'mfu_of_bfloat16_peak' not in result else format(result['mfu_of_bfloat16_peak'], '.2%')} | "
            f"{'' if ratio is None else f'{ratio:.2f}'} | "
            f"{result['first_step_seconds']:.1f} | "
            f"{'n/a' if memory is None else f'{memory / 2**20:,.0f}'} |"
        )
    peaks = ", ".join(
        f"{framework} {rate / 1e9:,.0f} GFLOP/s" for framework, rate in report["peak_matmul_flops_per_second"].items()
    )
    lines += ["", f"Measured matmul peak ({report['peak_matmul_size']}^3): {peaks}."]
    if report.get("bfloat16_peak_matmul_flops_per_second"):
        lines.append(
            f"bfloat16 peak through Keras: {report['bfloat16_peak_matmul_flops_per_second'] / 1e12:,.0f} TFLOP/s."
        )
    alone = {name: r["peak_memory_alone_bytes"] for name, r in report["contenders"].items() if "peak_memory_alone_bytes" in r}
    if alone:
        lines.append("Peak memory, each trained in a process of its own: " + ", ".join(
            f"{name} {value / 2**20:,.0f} MiB" for name, value in alone.items()
        ) + "".join(f"; {key} {value:.3f}" for key, value in report["ratios"].items() if "memory" in key) + ".")
    for name, reason in report["skipped"].items():
        lines.append(f"Skipped {name}: {reason}")
    return "\n".join(lines)


def plot(args, parser):
    """`--plot`: the ratios of the reports in `args.results` as one PNG."""
    from _support import collect_ratios
    from _support import plot_ratios

    bars = collect_ratios(args.results, args.prefer)
    if not bars:
        parser.error(f"no benchmark results in {args.results}")
    out = args.out or os.path.join(HERE, "results", "cpu_ratios.png")
    plot_ratios(bars, out, args.title)
    for label, value, target in bars:
        print(f"{label}: {value:.2f}" + ("" if target is None else f" (target {target})"))
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small",
                        help="tiny is for smoke tests")
    parser.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default="float32")
    parser.add_argument("--batch-size", type=int,
                        help="sentences per step, in place of the size's own")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per turn")
    parser.add_argument("--rounds", type=int, default=5, help="turns per contender")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="idle seconds before each turn")
    parser.add_argument("--contenders", nargs="*", default=["keras_hub", "torch"],
                        choices=["ours_accumulate", "ours_jit", "ours_steps_per_execution", "ours_xla_attention",
                                 "ours_other_products", "keras_hub", "torch"],
                        help="besides ours")
    parser.add_argument("--accumulate", type=int, default=4,
                        help="batches per update of ours_accumulate (--steps a multiple of it)")
    parser.add_argument("--memory-alone", action="store_true",
                        help="also the peak memory of ours (and ours_accumulate) each trained in a process of its own")
    parser.add_argument("--alone", help=argparse.SUPPRESS)  # memory_alone's child
    parser.add_argument("--steps-per-execution", type=int, default=8,
                        help="ours_steps_per_execution's (Keras's compile argument); divides --steps")
    parser.add_argument("--jit-compile", choices=["auto", "true", "false"], default="auto",
                        help="compile_model's jit_compile for ours and keras_hub")
    parser.add_argument("--data-parallel", action="store_true",
                        help="build the Keras models under the backend's data-parallel engine")
    parser.add_argument("--corpus", nargs=2, metavar=("SOURCE", "TARGET"),
                        help="parallel text files whose sentences' lengths make the batches, "
                        "bucketed as `keras-transformer train` does (default: random ids, one length)")
    parser.add_argument("--tokens-per-batch", type=int, default=25000,
                        help="with --corpus: padded tokens a side per batch (the paper's 25,000)")
    parser.add_argument("--buckets", type=int, default=8, help="with --corpus: at most this many lengths")
    parser.add_argument("--corpus-vocabulary", type=int, default=8000,
                        help="with --corpus: the BPE vocabulary learned from it, which sets the lengths")
    parser.add_argument("--profile", action="store_true",
                        help="then one traced turn per contender: the GPU's kernels (JAX, torch), the time by part "
                        "of the model (JAX, TensorFlow)")
    parser.add_argument("--out", help="where to write the JSON report (with --plot: the PNG)")
    parser.add_argument("--plot", action="store_true",
                        help="train nothing: draw the ratios of the reports in --results as one PNG")
    parser.add_argument("--results", default=os.path.join(HERE, "results"), help="with --plot: the reports' folder")
    parser.add_argument("--prefer", action="append", default=[], metavar="SUFFIX",
                        help="with --plot: read <name>_SUFFIX.json where it exists (repeatable, first wins)")
    parser.add_argument("--title", default="Training speed on this project's 2-core CPU", help="with --plot")
    args = parser.parse_args()
    if args.plot:
        plot(args, parser)
        return
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps and --rounds must be >= 1. Received: {args.steps}, {args.rounds}")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1. Received: {args.batch_size}")

    if args.corpus and (args.tokens_per_batch < 256 or not 1 <= args.buckets <= 64):
        parser.error(f"--tokens-per-batch must be >= 256 and --buckets from 1 to 64. "
                     f"Received: {args.tokens_per_batch}, {args.buckets}")
    for path in args.corpus or ():
        if not os.path.isfile(path):
            parser.error(f"--corpus: no such file: {path}")
    if "ours_steps_per_execution" in args.contenders and (
        args.steps_per_execution < 1 or args.steps % args.steps_per_execution
    ):
        parser.error(f"--steps-per-execution must be >= 1 and divide --steps ({args.steps}). "
                     f"Received: {args.steps_per_execution}")
    if "ours_accumulate" in args.contenders and (args.accumulate < 2 or args.steps % args.accumulate):
        parser.error(f"--accumulate must be >= 2 and divide --steps ({args.steps}). Received: {args.accumulate}")
    args.jit_compile = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
    args.dump = None
    if args.profile and keras.backend.backend() == "jax":
        import tempfile

        from _support import xla_dump_flags

        # Read when JAX starts its first device, which nothing has yet.
        args.dump = tempfile.mkdtemp(prefix="xla_modules_")
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {xla_dump_flags(args.dump)}".strip()
    report = run_alone(args) if args.alone else run(args)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as file:
            json.dump(report, file, indent=2)
    if not args.alone:
        print(markdown_table(report))


if __name__ == "__main__":
    main()
