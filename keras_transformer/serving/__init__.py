"""`keras-transformer serve`: translators behind LibreTranslate's HTTP API,
with the sentences of concurrent requests decoded together.

`serve(...)` loads the translators, compiles their shapes ahead, and runs
the server until it is stopped (SIGINT or SIGTERM: the requests accepted
are answered first). `create_app` gives the ASGI application alone, for a
server of one's own.
"""

import os
import signal
import threading

import keras

from keras_transformer.serving.app import Limits
from keras_transformer.serving.app import create_app
from keras_transformer.serving.metrics import Metrics
from keras_transformer.serving.service import Service

__all__ = ["Limits", "Metrics", "Service", "create_app", "load_translators", "serve"]

MISSING_EXTRA = 'serve needs Starlette, uvicorn and sentencex: pip install "keras-vaswani[serve]" (or, in a clone, pip install -e ".[serve]")'


def load_translators(model_dirs, languages=None, **overrides):
    """`{(source, target): (translator, directory)}` of the translator
    directories, with `languages` (pairs aligned with them, None to keep a
    translator's own)."""
    from keras_transformer.data.languages import check_pair
    from keras_transformer.decoding import Translator

    languages = [None] * len(model_dirs) if languages is None else list(languages)
    if len(languages) != len(model_dirs):
        raise ValueError(
            f"Give a language pair for each model directory, or none. Received {len(model_dirs)} "
            f"directories and {len(languages)} pairs."
        )
    translators = {}
    for directory, pair in zip(model_dirs, languages):
        translator = Translator.load(directory, **overrides)
        pair = check_pair(pair) or translator.languages
        if pair is None:
            raise ValueError(
                f"{directory} names no language pair (a translator trained before pairs were saved). "
                "Give one with --languages, such as --languages en-de."
            )
        if pair in translators:
            raise ValueError(f"{translators[pair][1]} and {directory} both translate {pair[0]}-{pair[1]}; serve one.")
        translators[pair] = (translator, directory)
    return translators


def serve(model_dirs, languages=None, host="127.0.0.1", port=5000, warm_up=True, limits=Limits(),
          batching=None, beam_sizes=(), threads=None, log=None, **overrides):
    """Serves the translators of `model_dirs` until stopped.

    Args:
        model_dirs: translator directories (`train`'s or `convert`'s).
        languages: None, or a `(source, target)` pair (or None) for each.
        host, port: where to listen.
        warm_up: compile every shape a batch can take before serving.
        limits: what one request may hold (`Limits`).
        batching: `Batcher`'s `max_tokens`, `max_wait`, `max_queue`,
            `across_requests`.
        beam_sizes: beam sizes requests may ask for, besides the
            translators' own.
        threads: None, or the CPU cores the backend computes on
            (`limit_threads`).
        log: where the start-up line goes.
        **overrides: `Translator.load` settings, such as `beam_size=1`.
    """
    try:
        import sentencex  # noqa: F401 - the service's sentence splitter
        import starlette  # noqa: F401 - create_app's
        import uvicorn
    except ImportError:
        raise ValueError(MISSING_EXTRA) from None
    if threads is not None:
        limit_threads(threads)
    translators = load_translators(model_dirs, languages, **overrides)
    metrics = Metrics()
    service = Service(translators, metrics, beam_sizes=beam_sizes, **(batching or {}))
    programs, seconds = service.warm_up() if warm_up else (0, 0.0)
    app = create_app(service, limits, backend=keras.backend.backend())
    served = ", ".join(f"{s}-{t} ({directory})" for (s, t), (_, directory) in translators.items())
    compiled = f"; warm-up: {programs} programs in {seconds:.1f} s" if warm_up else ""
    message = f"Serving {served} at http://{host}:{port} on {keras.backend.backend()}{compiled}"
    print(message, flush=True) if log is None else log(message)
    # uvicorn answers SIGINT and SIGTERM by answering the requests it
    # accepted and running the application's shutdown (the batchers'), then
    # raises the signal again for the handler it found: a stop asked for
    # is a clean exit, status 0.
    stops = (signal.SIGINT, signal.SIGTERM)
    main = threading.current_thread() is threading.main_thread()
    previous = [signal.signal(stop, _exit_cleanly) for stop in stops] if main else []
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=60)
    finally:
        for stop, handler in zip(stops, previous):
            signal.signal(stop, handler)


def limit_threads(threads):
    """Computes on `threads` CPU cores: the process runs on that many of
    the cores it may use (as `taskset` would), and TensorFlow and torch size
    their thread pools to match (JAX's XLA sizes its pool by the cores the
    process may use). Called before the backend computes anything."""
    affinity = hasattr(os, "sched_setaffinity")  # Linux's; elsewhere the pools alone are sized
    cores = sorted(os.sched_getaffinity(0)) if affinity else list(range(os.cpu_count() or 1))
    if not isinstance(threads, int) or not 1 <= threads <= len(cores):
        raise ValueError(f"threads must be an integer from 1 to the {len(cores)} cores this process may use. Received: {threads!r}")
    if affinity:
        os.sched_setaffinity(0, cores[:threads])
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def _exit_cleanly(signum, frame):
    raise SystemExit(0)
