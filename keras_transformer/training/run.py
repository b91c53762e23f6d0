"""A whole training run from parallel text files to a saved translator.

`keras-transformer train` and the recipes are configurations of this code:

    config = TrainingConfig(
        model_dir="runs/multi30k",
        train_source=["train.en"], train_target=["train.de"],
        valid_source=["val.en"], valid_target=["val.de"],
        preset="small", train_steps=3000,
    )
    translator = train_translator(config)

The run's configuration is written to `model_dir/train_config.json` before
training starts, so the run can be repeated, or resumed after a crash, from
that file alone (`TrainingConfig.load`). Everything that can be checked
(files, numbers, names, the model directory) is checked before any data is
read or any step is trained.
"""

import os
import time

import keras

from keras_transformer.data import held_out
from keras_transformer.data.batches import TokenBatches
from keras_transformer.data.corpus import concatenate
from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.corpus import read_parallel_text
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.sampling import SubwordSampling
from keras_transformer.data.prepared import MANIFEST_FILE
from keras_transformer.data.prepared import is_prepared
from keras_transformer.data.prepared import load_prepared
from keras_transformer.data.prepared import prepare_dataset
from keras_transformer.data.prepared import train_vocabulary
from keras_transformer.data.tokenizer import CONFIG_FILE as VOCABULARY_CONFIG_FILE
from keras_transformer.data.tokenizer import MODEL_FILE as VOCABULARY_FILE
from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.data.tokenizers import CONVERTED_FILE as CONVERTED_TOKENIZER_FILE
from keras_transformer.data.tokenizers import load_tokenizer
from keras_transformer.decoding.translator_directory import read_model
from keras_transformer.decoding.translator import Translator
from keras_transformer.models.transformer import build_transformer
from keras_transformer.training.checkpoints import average_checkpoints
from keras_transformer.training.checkpoints import check_writable
from keras_transformer.training.checkpoints import checkpoint_step
from keras_transformer.training.checkpoints import list_checkpoints
from keras_transformer.training.checkpoints import newest_readable
from keras_transformer.training.checkpoints import trained_steps
from keras_transformer.training.distribution import Distribution
from keras_transformer.training.distribution import local_reads
from keras_transformer.training.model_directory import hold_directory
from keras_transformer.training.progress import ProgressLog
from keras_transformer.training.progress import format_duration
from keras_transformer.training.board import Board
from keras_transformer.training.limits import StopAfter
from keras_transformer.training.limits import parse_duration
from keras_transformer.training.limits import steps_in_epochs
from keras_transformer.training.selection import BestCheckpoints
from keras_transformer.training.selection import standing
from keras_transformer.training.translator_choice import better_of_moving_average
from keras_transformer.training.translator_choice import final_checkpoints
from keras_transformer.training.translator_choice import languages
from keras_transformer.training.translator_choice import length_penalty
from keras_transformer.training.translator_choice import record_translator
from keras_transformer.training.translator_choice import validation_translator
from keras_transformer.training.validation import Validation
from keras_transformer.training.trainer import compile_model
from keras_transformer.training.trainer import fit
from keras_transformer.training.trainer import steps_per_execution
from keras_transformer.training.trainer import use_compilation_cache

from keras_transformer.training.config import CONFIG_FILE
from keras_transformer.training.config import CURVE_FILE, HISTORY_FILE
from keras_transformer.training.config import PREPARED_DIR
from keras_transformer.training.config import TrainingConfig

VALID_BUCKETS = 2

# What a resumed run may set anew: how long it trains, how patient it is
# (each resume counts from the run's history), where its logs go, and the
# folder itself, however it is spelled or wherever it was moved.
RESUME_MAY_CHANGE = ("train_steps", "max_epochs", "max_time", "patience", "tensorboard", "model_dir")

# A checkpoint newer than every process's: kept aside, out of the resume's way.
AHEAD_PREFIX = ".ahead-"


def prepare_model_dir(config, resume=False, write=True):
    """Checks that `config.model_dir` can take this run, and saves the config.

    A directory holding another run's checkpoints is refused unless
    `resume` is set; with `resume`, its saved configuration must equal this
    one, except `RESUME_MAY_CHANGE`: `train_steps` may grow to train
    longer.

    Returns:
        `(step, path)` of the checkpoint a resumed run continues from, the
        newest that loads (`newest_readable`), its step read from it;
        `(0, None)` for a new run.
    """
    model_dir = config.model_dir
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise ValueError(f"--model-dir {model_dir} exists and is not a directory.")
    checkpoints = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    saved_path = os.path.join(model_dir, CONFIG_FILE)
    if resume:
        if os.path.isfile(saved_path):
            saved = TrainingConfig.load(saved_path).to_dict()
            requested = config.to_dict()
            differences = [
                f"{key}: {saved.get(key)!r} in the run, {requested.get(key)!r} now"
                for key in sorted(requested)
                if key not in RESUME_MAY_CHANGE and saved.get(key) != requested.get(key)
            ]
            if differences:
                raise ValueError(
                    f"Cannot resume {model_dir} with a different configuration ("
                    + "; ".join(differences)
                    + "). Resume with its own train_config.json, or start a new --model-dir."
                )
        with local_reads():
            restored, path = newest_readable(os.path.join(model_dir, "checkpoints"), stacklevel=4)
            reached = 0 if restored is None else trained_steps(restored)
        del restored  # `fit` restores it again, for the model it is given
        if config.train_steps < reached:
            raise ValueError(
                f"{model_dir} is at step {reached} (its newest readable checkpoint, "
                f"{os.path.basename(path)}); --train-steps {config.train_steps} would go back. "
                f"Resume with --train-steps {reached} or more, or start a new --model-dir."
            )
    elif checkpoints:
        raise ValueError(
            f"{model_dir} already holds a run ({len(checkpoints)} checkpoints, the last "
            f"{os.path.basename(checkpoints[-1])}). Pass --resume to continue it, or "
            "choose another --model-dir."
        )
    else:
        reached, path = 0, None
    if write:  # else another process of the run writes the directory
        check_writable(os.path.join(model_dir, "checkpoints"))
        config.save()
    return reached, path


def read_corpus(sources, targets, name):
    """The pairs of several line-aligned file pairs, one after the other."""
    return concatenate([read_parallel_text(s, t) for s, t in zip(sources, targets)], name)


def train_translator(config, resume=False, log=print, verbose=0, heartbeat_timeout=None):
    """Trains a translator as `config` says, and saves it in its model dir.

    The model directory then holds what `Translator.load` (and the
    `translate`, `evaluate`, `plot-attention` and `export` commands) reads:
    `model.keras` (the average of the last `config.average` checkpoints),
    the vocabulary and the search settings; and also `train_config.json`,
    `checkpoints/`, `history.jsonl` (the validation curve),
    `train_curve.csv` (the training curve) and `logs/` (TensorBoard, where
    TensorFlow is installed).

    Args:
        config: a `TrainingConfig`.
        resume: continue the run already in `config.model_dir`.
        log: where progress lines go.
        verbose: Keras's own progress output (0: none, as `log` has it).
        heartbeat_timeout: for a run of several processes, the seconds
            after which a silent one is lost (`Distribution`).

    Returns:
        The saved `Translator`.
    """
    config.validate()
    # First: JAX's processes join before anything starts JAX (a checkpoint read).
    distribution = Distribution(heartbeat_timeout=heartbeat_timeout)
    with hold_directory(distribution, config.model_dir, log) as turns:
        return _train(config, resume, log, verbose, distribution, turns)


def _train(config, resume, log, verbose, distribution, turns):
    reached, resumed_from = prepare_model_dir(config, resume, write=turns.writes)
    if resume and distribution.processes > 1:
        reached, resumed_from = _common_checkpoint(distribution, config.model_dir, reached, resumed_from, log)
    keras.utils.set_random_seed(config.seed)
    started = time.time()
    if resumed_from is not None:
        log(
            f"resuming from {os.path.basename(resumed_from)}: step {reached} of {config.train_steps}"
            + ("; nothing left to train, the translator is saved again from the checkpoints" if reached >= config.train_steps else "")
        )

    tokenizer = turns.in_turn(lambda: _vocabulary(config, log, write=turns.writes))
    train = turns.in_turn(lambda: _training_pairs(config, tokenizer, log))
    valid = _validation_pairs(config)
    log(valid.summary())

    log(f"{distribution}")
    use_compilation_cache()
    train_data = TokenBatches(
        train, config.tokens_per_batch, max_length=config.max_tokens,
        bucket_step=config.bucket_step, buckets=config.buckets, repeat=True, seed=config.seed,
        batch_multiple=distribution.num_replicas,
        shard=distribution.data_shard, accumulate=config.accumulate,
        sampling=None if config.subword_alpha is None else SubwordSampling(tokenizer, config.subword_alpha),
    )
    lengths = train_data.lengths
    how = f"bucket_step {config.bucket_step}" if config.buckets is None else f"fitted, buckets {config.buckets}"
    if config.subword_alpha is not None:
        how += f"; segmentations drawn at alpha {config.subword_alpha}"
    log(f"batches: {len(lengths)} length{'s' * (len(lengths) > 1)} from {lengths[0]} to {lengths[-1]} tokens ({how})")
    train_steps = config.train_steps
    if config.max_epochs is not None:
        in_epochs = steps_in_epochs(config.max_epochs, train_data.batches_per_epoch, config.accumulate)
        if in_epochs < train_steps:
            train_steps = in_epochs
            log(f"--max-epochs {config.max_epochs}: {train_steps} steps of {train_data.batches_per_epoch} batches an epoch")
    valid_data = validation_batches(config, valid, tokenizer)
    with distribution.scope():
        if config.init_from is not None:
            model = _initial_model(config, tokenizer)
            architecture = {name: getattr(model, name) for name in ("vocabulary_size", "num_layers", "d_model", "d_ff")}
            log(f"model: from {config.init_from}")
        else:
            architecture = config.architecture() | {"vocabulary_size": tokenizer.vocabulary_size}
            model = build_transformer(
                config.preset, **architecture,
                dtype=None if config.dtype == "float32" else config.dtype,
            )
        compile_model(
            model, warmup_steps=config.warmup_steps, label_smoothing=config.label_smoothing,
            learning_rate_scale=config.learning_rate_scale, jit_compile=config.jit_compile,
            steps_per_execution=_steps_per_execution(config, train_steps, reached), count_tokens=True,
            accumulate=config.accumulate, ema=config.ema, record_gradient_norm=True,
            **({} if config.clip_norm is None else {"global_clipnorm": config.clip_norm}),
        )
    log(
        f"model: {model.count_params():,} parameters ("
        + ", ".join(f"{k}={v}" for k, v in architecture.items())
        + f", dtype={config.dtype})"
    )

    if config.init_from is not None and not reached:
        before = model.evaluate(valid_data, verbose=0, return_dict=True)
        log(f"valid loss before fine-tuning: {before['loss']:.3f}")

    checkpoint_dir = os.path.join(config.model_dir, "checkpoints")
    history_path = os.path.join(config.model_dir, HISTORY_FILE)
    board = Board(config.tensorboard or os.path.join(config.model_dir, "logs"), resumed_at=reached) if turns.writes else None
    callbacks = [
        ProgressLog(
            train_steps, every=config.log_every, log=log,
            curve_path=os.path.join(config.model_dir, CURVE_FILE) if turns.writes else None, board=board,
        ),
        Validation(
            validation_translator(config, model, tokenizer),
            valid.sources[: config.valid_bleu_sentences], valid.targets[: config.valid_bleu_sentences],
            metrics=config.valid_metrics, history_path=history_path if turns.writes else None, log=log, board=board,
        ),
    ]
    if config.max_time is not None:
        agree = distribution.least if distribution.processes > 1 else None
        callbacks.append(StopAfter(parse_duration(config.max_time), log=log, agree=agree, every=config.log_every))
    selection = None
    if config.best_metric is not None:
        selection = BestCheckpoints(
            checkpoint_dir, history_path, config.best_metric, keep=config.best_kept(),
            patience=config.patience, log=log, write=turns.writes,
            agree=distribution.least if distribution.processes > 1 else None,
        )
    if selection is not None and reached and selection.exhausted(standing(history_path, config.best_metric, reached)):
        log(f"the run stopped early at step {reached} (patience {config.patience}); nothing left to train")
    else:
        try:
            model = fit(
                model, train_data, config.model_dir, train_steps,
                checkpoint_every=config.checkpoint_every,
                keep_checkpoints=config.keep_checkpoints or config.last_averaged() or 1,
                validation_data=valid_data, callbacks=callbacks, verbose=verbose, write=turns.writes,
                board=board, selection=selection,
            )
        finally:
            if board is not None:
                board.close()
    turns.after_writer()  # its last checkpoint is written

    kept, how = final_checkpoints(config, checkpoint_dir, history_path)
    final = average_checkpoints(kept)
    if config.ema is not None:
        final, kept, how = better_of_moving_average(
            config, final, kept, how, checkpoint_dir, valid, valid_data, tokenizer, log
        )
    translator = Translator(
        final, tokenizer, beam_size=config.beam_size, alpha=config.alpha,
        max_extra_length=config.max_extra_length, max_source_length=config.max_tokens,
        length_penalty=length_penalty(config), languages=languages(config),
    )
    if turns.writes:
        with local_reads():  # as checkpoints are saved (`SaveCheckpoints`)
            translator.save(config.model_dir)
    if turns.writes:
        record_translator(history_path, how, kept)
    log(
        ("saved" if turns.writes else "the first process saved") + f" the translator ({how}: "
        + ", ".join(os.path.basename(path) for path in kept)
        + f") in {config.model_dir} after {format_duration(time.time() - started)}"
    )
    return translator


def _common_checkpoint(distribution, model_dir, reached, path, log):
    """`(step, path)` of the newest checkpoint every process of the run has:
    the processes agree on the least of their newest steps, and a process
    that is ahead (killed peers write one checkpoint fewer) sets its newer
    checkpoints aside, as `.ahead-ckpt-<step>.keras`, and resumes there too."""
    common = distribution.least(reached)
    if common == reached:
        return reached, path
    directory = os.path.join(model_dir, "checkpoints")
    ahead = [p for p in list_checkpoints(directory) if checkpoint_step(p) > common]
    for newer in ahead:
        os.replace(newer, os.path.join(directory, AHEAD_PREFIX + os.path.basename(newer)))
    with local_reads():
        restored, path = newest_readable(directory)
        step = 0 if restored is None else trained_steps(restored)
    if step != common:
        raise ValueError(
            f"The run's processes have step {common} in common, but this one's newest readable checkpoint "
            f"in {directory} is now at step {step}; resume from a copy of another process's checkpoints."
        )
    log(
        f"the processes' newest common checkpoint is at step {common}: set aside "
        + ", ".join(os.path.basename(p) for p in ahead) + f" as {AHEAD_PREFIX}..."
    )
    return common, path


def validation_batches(config, valid, tokenizer):
    """The validation pairs in batches of at most `VALID_BUCKETS` lengths,
    fitted to them. The test step compiles once per length, and validation
    is small beside training: Multi30k's `val` at the recipe's `bucket_step`
    1.1 made 24 lengths in 24 batches, each bucket's last filled with
    padding (98,065 padded target tokens for 16,593 real ones); fitted, 2
    lengths in 8 batches (32,664)."""
    return make_dataset(
        valid, tokenizer, config.tokens_per_batch, max_length=config.max_tokens,
        buckets=min(config.buckets or VALID_BUCKETS, VALID_BUCKETS), shuffle=False,
    )


def _steps_per_execution(config, train_steps, reached):
    """Under JAX, up to 8 steps a call of the train function: between calls
    Keras reads the logs and JAX waits for the GPU, which then idles. On an
    H200 the base model's step took 41 ms instead of 56 (Multi30k lengths,
    25,000 tokens). Elsewhere 1 step: the others were not measured so."""
    if keras.backend.backend() != "jax":
        return 1
    # In batches; a call ends within an update (progress lines at its end).
    counts = (train_steps, config.checkpoint_every, config.log_every, reached, 1)
    return steps_per_execution(*(config.accumulate * count for count in counts))


def _initial_model(config, tokenizer):
    """The model of `config.init_from`, with its weights, in the run's dtype,
    as `Translator.load(init_from, compile=True)` reads it."""
    model = read_model(config.init_from, for_training=True)
    if model.vocabulary_size != tokenizer.vocabulary_size:
        raise ValueError(
            f"{config.init_from}'s model has {model.vocabulary_size} ids and its tokenizer "
            f"{tokenizer.vocabulary_size}; they do not belong together."
        )
    if config.dtype != model.dtype_policy.name:
        settings = model.get_config() | {"dtype": None if config.dtype == "float32" else config.dtype}
        retyped = type(model).from_config(settings)
        retyped.set_weights(model.get_weights())
        model = retyped
    return model


def _vocabulary(config, log, write=True):
    """The run's vocabulary: its own when resuming, the started-from
    translator's, the given one, or new; saved in the run's directory
    (`write`), or read there where another process saved it."""
    own = os.path.join(config.model_dir, VOCABULARY_FILE)
    given = config.train_data or config.vocabulary

    def keep(tokenizer):
        """`tokenizer`, saved as the run's own where this process writes."""
        if write:
            tokenizer.save(config.model_dir)
        return tokenizer

    converted = os.path.isfile(os.path.join(config.model_dir, CONVERTED_TOKENIZER_FILE))
    if config.init_from is not None or converted:
        # A resumed run reads its own copy; a new one copies the translator's.
        where = config.model_dir if converted or os.path.isfile(own) else config.init_from
        tokenizer = keep(load_tokenizer(where))
        log(f"vocabulary: {tokenizer.vocabulary_size} ids from {where}")
        return tokenizer
    if os.path.isfile(own) or os.path.isfile(os.path.join(config.model_dir, VOCABULARY_CONFIG_FILE)):
        try:
            tokenizer = SubwordTokenizer.load(config.model_dir)
            log(f"vocabulary: {tokenizer.vocabulary_size} pieces from {config.model_dir}")
            return tokenizer
        except (ValueError, FileNotFoundError) as error:  # torn or missing: a kill before atomic writes
            checkpoints = list_checkpoints(os.path.join(config.model_dir, "checkpoints"))
            if given is None and checkpoints:
                raise ValueError(
                    f"{error} The run's checkpoints ({len(checkpoints)}) were trained with that vocabulary, "
                    f"so it cannot be made anew: put back {VOCABULARY_FILE} and {VOCABULARY_CONFIG_FILE} "
                    f"from a copy of {config.model_dir}, or start a new --model-dir."
                ) from None
            log(f"vocabulary: {error} Making it again as the run first did (no checkpoint needs another).")
    if given is not None:
        tokenizer = keep(SubwordTokenizer.load(given))
        log(f"vocabulary: {tokenizer.vocabulary_size} pieces from {given}")
    else:
        start = time.time()
        tokenizer = keep(train_vocabulary(
            config.train_source, config.train_target, config.vocabulary_size, seed=config.seed
        ))
        log(
            f"vocabulary: trained {tokenizer.vocabulary_size} shared BPE pieces in "
            f"{time.time() - start:.0f}s"
        )
    return tokenizer


def _validation_pairs(config):
    """The validation files' pairs, or those held out of the training text
    when the run was prepared (`valid_fraction`)."""
    if config.valid_fraction is None:
        return read_corpus(config.valid_source, config.valid_target, "valid")[: config.valid_pairs]
    where = os.path.join(config.model_dir, PREPARED_DIR)
    held = [os.path.join(where, name) for name in (held_out.SOURCE_FILE, held_out.TARGET_FILE)]
    valid = read_corpus([held[0]], [held[1]], "valid (held out)")[: config.valid_pairs]
    if not len(valid):
        raise ValueError(
            f"valid_fraction={config.valid_fraction} held out no pair of the training text "
            f"(see {held[0]}); give a larger fraction, or validation files."
        )
    return valid


def _prepared_for(config, where):
    """Whether `where` holds this configuration's text, prepared with its
    held-out fraction (a new run into the folder may have changed either)."""
    if not is_prepared(where):
        return False
    manifest = read_json_object(os.path.join(where, MANIFEST_FILE))
    files = [(entry.get("source"), entry.get("target")) for entry in manifest.get("files", [])]
    return files == list(zip(config.train_source, config.train_target)) and (
        manifest.get("held_out") or {}
    ).get("fraction") == config.valid_fraction


def _training_pairs(config, tokenizer, log):
    """The training pairs as mapped arrays: the given prepared set, the
    run's own (prepared at its start), or prepared now from the text."""
    if config.train_data is not None:
        pairs = load_prepared(config.train_data, tokenizer)
        where = config.train_data
    else:
        where = os.path.join(config.model_dir, PREPARED_DIR)
        if _prepared_for(config, where):
            pairs = load_prepared(where, tokenizer)
        else:
            start = time.time()
            pairs = prepare_dataset(
                config.train_source, config.train_target, tokenizer, where, held_out=config.valid_fraction
            )
            log(f"prepared the training text into {where} in {format_duration(time.time() - start)}")
    manifest = pairs.manifest
    left_out = manifest["left_out"]
    log(
        f"train: {manifest['pairs']} pairs from {where}; skipped {left_out['empty_side']} with an "
        f"empty side, {left_out['too_long']} over 65,534 tokens"
    )
    return pairs
