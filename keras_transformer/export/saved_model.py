"""A SavedModel for TF Serving: raw text in, translations out.

This is the one module that knows how a Keras model becomes a TensorFlow
graph. Under the TensorFlow backend the model's variables are the graph's
variables. A model trained under JAX or torch is saved as a `.keras` file
and exported by a TensorFlow-backend process that loads it, so the exported
graph is the same whichever backend trained the weights.

The graph tokenizes with tensorflow-text's SentencePiece op, runs the
encoder once, searches with `search_translations` (the Translator's beam
search, the same `keras.ops` code traced into TensorFlow) and detokenizes.
A server that links tensorflow-text needs nothing else.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import keras
import tensorflow as tf

from keras_transformer.data.pipeline import bucket_lengths
from keras_transformer.decoding.steps import search_translations
from keras_transformer.export.graph_tokenizers import SUBWORD_ASSET  # noqa: F401 - the asset clients read
from keras_transformer.export.graph_tokenizers import graph_tokenizer

TEXT_SIGNATURE = "serving_default"
IDS_SIGNATURE = "translate_ids"
SETTINGS_ASSET = "translator.json"
# An export in progress: hidden from TF Serving, which loads numbered folders.
PARTIAL_PREFIX = ".partial-"
# A request may cost what this many rows of max_source_length tokens cost,
DEFAULT_REQUEST_ROWS = 32
# and hold at most this many texts: each holds beam x vocabulary scores a step.
DEFAULT_MAX_REQUEST_ROWS = 2 * DEFAULT_REQUEST_ROWS

# Python's str.isspace(), in RE2: the Translator's "blank line" test.
_BLANK = r"[\s\x{0B}\x{1C}-\x{1F}\x{85}\p{Z}]*"


def request_budget(translator, rows=DEFAULT_REQUEST_ROWS):
    """The cost of `rows` full rows: rows x (max_source_length +
    max_extra_length) tokens decoded per beam."""
    return request_cost(rows, translator.max_source_length, translator.max_extra_length)


def request_bounds(translator, max_request_tokens=None, max_request_rows=None):
    """`(max_request_tokens, max_request_rows)`, None taking the default:
    what `DEFAULT_REQUEST_ROWS` full rows cost, and `DEFAULT_MAX_REQUEST_ROWS`."""
    return (
        request_budget(translator) if max_request_tokens is None else max_request_tokens,
        DEFAULT_MAX_REQUEST_ROWS if max_request_rows is None else max_request_rows,
    )


def request_cost(rows, longest, max_extra_length):
    """What a request of `rows` texts, the longest `longest` tokens with its
    EOS, costs: every row of a batched search runs as long as the longest
    row's limit, on `beam_size` beams, with a cache that long; so rows x
    (longest + max_extra_length) tokens per beam bound both its steps and its
    memory."""
    return rows * (longest + max_extra_length)


def export_saved_model(translator, path, max_request_tokens=None, max_request_rows=None):
    """Writes `translator` as a SavedModel that TF Serving can load.

    Signatures:
        `serving_default`: `text` (string `[batch]`) -> `translation`
            (string `[batch]`) and `score` (float32 `[batch]`, log P / lp of
            the best hypothesis). Tokenizing, beam search with the
            translator's `beam_size` and `alpha`, and detokenizing all run in
            the graph.
        `translate_ids`: `source_ids` (int32 `[batch, length]`, subword ids
            without EOS, padded with 0) -> `target_ids` (int32
            `[batch, length]`, without BOS and EOS, padded with 0) and
            `score`.

    Rows are independent: an empty or whitespace-only line gives "" and
    score 0; a line longer than `max_source_length` tokens is cut, as
    `Translator` cuts it; bytes that are not UTF-8 become U+FFFD instead of
    failing the batch, which a server may have assembled from several
    clients' requests. An empty batch gives empty outputs.

    The cost of a request is bounded, so that one request cannot take a
    server down. Each text is cut to `max_source_bytes` bytes before it is
    tokenized (twice what `max_source_length` tokens can span: the tokens
    kept are unchanged, unless the cut falls inside one word that long).
    Each row's output is at most its length plus `max_extra_length` tokens,
    and a batched search runs every row as long as the longest row's limit:
    a request of n texts whose longest has m tokens (with EOS, up to
    `max_source_length`) costs n x (m + `max_extra_length`) tokens per beam
    (`request_cost`), in time and in cache memory. It may cost at most
    `max_request_tokens` and hold at most `max_request_rows` texts (each
    holds beam x vocabulary scores at every step, whatever its length); past
    either it fails with INVALID_ARGUMENT, saying so, before any decoding. With TF Serving's request batching, a merged
    batch is one request: keep `max_batch_size` full rows within
    `max_request_tokens` (saved_models/README.md).

    The SentencePiece model is stored in `assets/subword.model` (for
    clients of `translate_ids`) and the search settings, with both bounds,
    in `assets/translator.json`.

    Under JAX or torch the export runs in a TensorFlow-backend subprocess
    that loads the translator's saved model file. The graph is not
    XLA-compiled, whatever the translator's `jit_compile`: TF Serving runs
    XLA functions only behind an experimental flag on CPU.

    Args:
        translator: a `keras_transformer.Translator`.
        path: the directory to create; it must not exist or be empty.
        max_request_tokens: the most a request may cost, in tokens per
            beam; None: what `DEFAULT_REQUEST_ROWS` (32) full rows cost
            (`request_budget`: 32 x (256 + 50) = 9,792 by default).
        max_request_rows: the most texts a request may hold; None:
            `DEFAULT_MAX_REQUEST_ROWS` (64).

    Returns:
        `path`.
    """
    path = os.fspath(path)
    graph_tokenizer(translator.tokenizer)  # refuses a tokenizer with no TensorFlow op, before any work
    one_row = request_budget(translator, rows=1)
    max_request_tokens, max_request_rows = request_bounds(translator, max_request_tokens, max_request_rows)
    if isinstance(max_request_rows, bool) or not isinstance(max_request_rows, int) or max_request_rows < 1:
        raise ValueError(f"max_request_rows must be an integer >= 1. Received: max_request_rows={max_request_rows!r}")
    if (
        isinstance(max_request_tokens, bool)
        or not isinstance(max_request_tokens, int)
        or max_request_tokens < one_row
    ):
        raise ValueError(
            f"max_request_tokens must be an integer >= max_source_length + max_extra_length = "
            f"{translator.max_source_length} + {translator.max_extra_length} = {one_row}, so that one "
            f"full row fits. Received: max_request_tokens={max_request_tokens!r}"
        )
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise FileExistsError(
            f"Will not export into {path!r}: it exists and is not an empty "
            "directory. Choose a new path, or use export_new_version()."
        )
    if keras.backend.backend() == "tensorflow":
        _write_saved_model(translator, path, max_request_tokens, max_request_rows)
    else:
        _export_in_tensorflow_process(translator, path, max_request_tokens, max_request_rows)
    return path


def _write_saved_model(translator, path, max_request_tokens, max_request_rows):
    tokenizer = graph_tokenizer(translator.tokenizer)
    with tempfile.TemporaryDirectory() as assets:
        asset_files = []
        for name, content in tokenizer.assets().items():
            asset_files.append(os.path.join(assets, name))
            with open(asset_files[-1], "wb") as file:
                file.write(content)
        settings_file = os.path.join(assets, SETTINGS_ASSET)
        with open(settings_file, "w") as file:
            json.dump(_settings(translator, tokenizer, max_request_tokens, max_request_rows), file, indent=2)
        module = _serving_module(translator, tokenizer, asset_files, settings_file, max_request_tokens, max_request_rows)
        tf.saved_model.save(
            module,
            path,
            signatures={
                TEXT_SIGNATURE: module.translate_text,
                IDS_SIGNATURE: module.translate_ids,
            },
        )


def _settings(translator, graph_tokens, max_request_tokens, max_request_rows):
    tokenizer = translator.tokenizer
    return {
        **translator.get_config(),
        "max_source_bytes": max_source_bytes(translator, graph_tokens),
        "max_request_tokens": max_request_tokens,
        "max_request_rows": max_request_rows,
        "vocabulary_size": tokenizer.vocabulary_size,
        "padding_id": tokenizer.padding_id,
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "signatures": {
            TEXT_SIGNATURE: ", ".join(text_inputs(graph_tokens)) + " -> translation, score",
            IDS_SIGNATURE: "source_ids -> target_ids, score",
        },
    }


def text_inputs(graph_tokens):
    """The text signature's inputs: a multilingual translator's requests
    also name each text's languages."""
    return ["text"] + (["source_language", "target_language"] if hasattr(graph_tokens, "language_ids") else [])


def max_source_bytes(translator, tokenizer=None):
    """The bytes a text is cut to before tokenizing: twice what
    `max_source_length` pieces of the vocabulary's longest piece (in UTF-8)
    can span, so that the first `max_source_length` tokens stay as they
    were, unless the cut falls inside a word that long."""
    tokenizer = tokenizer or graph_tokenizer(translator.tokenizer)  # the module's own, when it has one
    longest = max(len(piece.encode("utf-8")) for piece in tokenizer.pieces())
    return 2 * translator.max_source_length * longest


def _serving_module(translator, graph_tokens, asset_files, settings_file, max_request_tokens, max_request_rows):
    """A `tf.Module` holding the weights, the tokenizer and both functions."""
    model = translator.model
    tokenizer = translator.tokenizer
    vocabulary_size = tokenizer.vocabulary_size
    eos_id = tokenizer.eos_id
    max_source_length = translator.max_source_length
    source_lengths = tf.constant(bucket_lengths(max_source_length, step=1.5), tf.int32)
    byte_limit = max_source_bytes(translator, graph_tokens)

    module = tf.Module()
    module.tokenizer = graph_tokens
    module.tokenizer_files = [tf.saved_model.Asset(path) for path in asset_files]
    module.settings = tf.saved_model.Asset(settings_file)

    prefix = translator.target_prefix

    def search(source_ids, sentence_max_length, forced_ids):
        ids, scores = search_translations(
            model,
            source_ids,
            sentence_max_length,
            translator.search_settings,
            bos_id=tokenizer.bos_id,
            start_id=getattr(tokenizer, "start_as_id", tokenizer.bos_id),
            eos_id=eos_id,
            forced_ids=forced_ids,
        )
        return ids[:, 0], scores[:, 0]

    def translate_rows(source_ids, languages=None):
        """Best target ids `[batch, length]` (0-padded) and scores of ragged
        source ids without EOS; rows without ids get no ids and score 0.
        The translator's target prefix begins every output, as in
        `Translator`; `languages`, our ids of each row's target language
        token, replace its first id."""
        batch_size = source_ids.nrows(out_type=tf.int32)
        rows = tf.cast(tf.where(source_ids.row_lengths() > 0)[:, 0], tf.int32)
        count = tf.size(rows)
        sources = tf.gather(source_ids, rows)[:, : max_source_length - 1]
        sources = tf.concat([sources, tf.fill([count, 1], eos_id)], axis=1)
        lengths = tf.cast(sources.row_lengths(), tf.int32)
        longest = tf.reduce_max(tf.concat([lengths, [1]], axis=0))
        within_budget = tf.debugging.assert_less_equal(
            request_cost(tf.cast(count, tf.int64), tf.cast(longest, tf.int64), translator.max_extra_length),
            tf.constant(max_request_tokens, tf.int64),
            message=(
                f"The request costs more than this export decodes at once: "
                f"max_request_tokens={max_request_tokens}, counted as texts x (tokens of the longest "
                f"text with EOS, up to max_source_length={max_source_length}, + "
                f"max_extra_length={translator.max_extra_length}). Split it into smaller "
                "requests. Received:"
            ),
        )
        within_rows = tf.debugging.assert_less_equal(
            count,
            max_request_rows,
            message=(
                f"The request holds more texts than this export decodes at once: "
                f"max_request_rows={max_request_rows} texts that are not empty. Split it into "
                "smaller requests. Received:"
            ),
        )
        with tf.control_dependencies([within_budget, within_rows]):
            longest = tf.identity(longest)
        # The Translator's source buckets, so both decode the same shapes.
        width = tf.gather(source_lengths, tf.searchsorted(source_lengths, [longest]))[0]
        dense = sources.to_tensor(0, shape=tf.stack([count, width]))
        # "input length + max_extra_length": the tokens before EOS.
        limits = lengths - 1 + translator.max_extra_length
        forced = tf.tile(tf.constant([prefix], tf.int32), [count, 1]) if prefix else None
        if languages is not None:  # each row's language token, then the rest of the prefix
            rest = tf.zeros([count, 0], tf.int32) if forced is None else forced[:, 1:]
            forced = tf.concat([tf.gather(languages, rows)[:, None], rest], axis=1)
        ids, scores = tf.cond(
            count > 0,
            lambda: search(dense, limits, forced),
            lambda: (tf.zeros([0, 1], tf.int32), tf.zeros([0], tf.float32)),
        )
        before_eos = tf.cumsum(tf.cast(ids == eos_id, tf.int32), axis=1) == 0
        targets = tf.ragged.boolean_mask(ids, before_eos & (ids != 0)).to_tensor(0)
        # At least one column: when every translation is empty (EOS first),
        # a scatter into a [batch, 0] tensor fails.
        targets = tf.pad(targets, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(targets)[1])]])
        rows = rows[:, None]
        target_ids = tf.scatter_nd(rows, targets, tf.stack([batch_size, tf.shape(targets)[1]]))
        scores = tf.scatter_nd(rows, tf.cast(scores, tf.float32), [batch_size])
        return target_ids, scores

    def text_to_translation(text, *languages):
        # Cut before tokenizing, so a huge string costs no more than a long
        # one; a character cut in two becomes U+FFFD below.
        text = tf.strings.substr(text, 0, byte_limit, unit="BYTE")
        text = tf.strings.unicode_transcode(
            text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        # A blank line becomes "", which has no ids and so no translation.
        text = tf.where(tf.strings.regex_full_match(text, _BLANK), "", text)
        source_ids = module.tokenizer.tokenize(text, *languages[:1])
        target_ids, scores = translate_rows(source_ids, *(module.tokenizer.language_id(code, 1) for code in languages[1:]))
        translation = module.tokenizer.detokenize(tf.RaggedTensor.from_tensor(target_ids, padding=0))
        return {"translation": translation, "score": scores}

    translate_text = tf.function(
        text_to_translation,
        input_signature=[tf.TensorSpec([None], tf.string, name=name) for name in text_inputs(graph_tokens)],
        autograph=False,
    )

    @tf.function(
        input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")],
        autograph=False,
    )
    def translate_ids(source_ids):
        checks = [
            tf.debugging.assert_non_negative(
                source_ids, message="translate_ids: source_ids must be >= 0 (0 is padding)"
            ),
            tf.debugging.assert_less(
                source_ids,
                vocabulary_size,
                message=f"translate_ids: source_ids must be < the vocabulary size {vocabulary_size}",
            ),
        ]
        with tf.control_dependencies(checks):
            source_ids = tf.RaggedTensor.from_tensor(source_ids, padding=0)
        target_ids, scores = translate_rows(source_ids)
        return {"target_ids": target_ids, "score": scores}

    module.translate_text = translate_text
    module.translate_ids = translate_ids
    # The TensorFlow variables the functions captured, not the Keras model's
    # variable objects: a server that loads the SavedModel into a session,
    # as TF Serving does, restores exactly the variables tracked here.
    captured = {}
    for function in (translate_text, translate_ids):
        for variable in function.get_concrete_function().variables:
            captured[id(variable)] = variable
    module.model_variables = list(captured.values())
    return module


def _export_in_tensorflow_process(translator, path, max_request_tokens, max_request_rows):
    with tempfile.TemporaryDirectory() as saved:
        translator.save(saved)
        command = [
            sys.executable, "-m", "keras_transformer", "export",
            "--model-dir", saved, "--output", os.path.abspath(path),
            "--max-request-tokens", str(max_request_tokens),
            "--max-request-rows", str(max_request_rows),
        ]  # fmt: skip
        environment = {**os.environ, "KERAS_BACKEND": "tensorflow"}
        result = subprocess.run(command, env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"Exporting under the TensorFlow backend failed (exit {result.returncode}) "
            f"for a model trained under {keras.backend.backend()}:\n{result.stderr[-3000:]}"
        )


def export_new_version(translator, name, base_dir="saved_models", max_request_tokens=None, max_request_rows=None):
    """Exports into TF Serving's layout, `<base_dir>/<name>/<version>/`.

    The version is one more than the highest existing one (1 for the first
    export). The SavedModel is written under a name TF Serving ignores and
    then renamed, so a server watching `<base_dir>/<name>` never loads a
    half-written version. That name holds the exporting process's id, so an
    export killed midway (kill -9, a lost machine) leaves a folder that the
    next export on this machine removes, while the folder of an export still
    running is left alone.

    `max_request_tokens` and `max_request_rows` are `export_saved_model`'s.

    Returns:
        The new version's directory.
    """
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(
            f"The model name must be one directory name, as TF Serving's "
            f"--model_name. Received: name={name!r}"
        )
    model_base = os.path.join(base_dir, name)
    os.makedirs(model_base, exist_ok=True)
    _remove_abandoned_exports(model_base)
    partial = tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{os.getpid()}-", dir=model_base)
    try:
        shutil.rmtree(partial)
        export_saved_model(translator, partial, max_request_tokens, max_request_rows)
        while True:
            target = os.path.join(model_base, str(_latest_version(model_base) + 1))
            try:
                os.rename(partial, target)
                return target
            except OSError:
                if not os.path.exists(target):
                    raise
                # Another export took this version meanwhile; take the next.
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _remove_abandoned_exports(model_base):
    """Removes the partial folders of exports whose process is gone."""
    for entry in os.listdir(model_base):
        if not entry.startswith(PARTIAL_PREFIX):
            continue
        pid = entry[len(PARTIAL_PREFIX):].split("-")[0]
        # Folders without an id come from versions that did not write one.
        if not pid.isdigit() or not _process_exists(int(pid)):
            shutil.rmtree(os.path.join(model_base, entry), ignore_errors=True)


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _latest_version(model_base):
    versions = [int(entry) for entry in os.listdir(model_base) if entry.isdigit()]
    return max(versions, default=0)
