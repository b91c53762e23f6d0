"""Training as in the paper, around plain `model.fit`."""

import contextlib
import os
import threading

import keras
import numpy as np

from keras_transformer.backend import keras_private
from keras_transformer.checks import check_count
from keras_transformer.files import cache_directory
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import MaskedTokenAccuracy
from keras_transformer.metrics import Perplexity
from keras_transformer.metrics import TargetTokens
from keras_transformer.optimizers import transformer_adam
from keras_transformer.training.board import Board
from keras_transformer.training.board import WriteBoard
from keras_transformer.training.checkpoints import SaveCheckpoints
from keras_transformer.training.checkpoints import check_writable
from keras_transformer.training.checkpoints import restore_latest
from keras_transformer.training.step_hooks import StepHook


def _replicas(model):
    """The replicas of the TensorFlow strategy `model` was made under; 1
    under the other backends."""
    if keras.backend.backend() != "tensorflow":
        return 1
    return model.distribute_strategy.num_replicas_in_sync


def compile_model(
    model,
    warmup_steps=4000,
    label_smoothing=0.1,
    jit_compile="auto",
    learning_rate_scale=1.0,
    steps_per_execution=1,
    count_tokens=False,
    accumulate=1,
    ema=None,
    **optimizer_kwargs,
):
    """Compiles `model` with the paper's training setup (sections 5.3, 5.4).

    Adam (beta1=0.9, beta2=0.98, epsilon=1e-9) on the warmup/rsqrt schedule,
    cross-entropy with label smoothing eps_ls, masked token accuracy and
    perplexity. Mixed precision comes from the model's dtype policy
    (`build_transformer(..., dtype="mixed_bfloat16")`); under
    `mixed_float16`, the optimizer is wrapped in dynamic loss scaling.

    Args:
        model: a `Transformer`.
        warmup_steps: 4000 in the paper.
        label_smoothing: 0.1 in the paper.
        jit_compile: XLA for the train step: `"auto"` (Keras's choice: XLA
            on GPU under TensorFlow, always under JAX, none under torch),
            True or False. Under torch, True is `torch.compile`, which made
            our steps slower on a GPU.
        learning_rate_scale: a constant factor on the schedule (1 in the
            paper).
        steps_per_execution: Keras's: steps run per call of the train
            function, their logs and callbacks seen once per call. Above 1,
            JAX queues the next steps while the GPU runs one. 1 under torch.
        accumulate: batches per optimizer update. The batches must weigh
            each loss by its share of the update's target tokens
            (`TokenBatches(..., accumulate=N)` does), so that the update
            is that of one batch holding their sentences: Keras's
            accumulation averages the batches' gradients.
        ema: the decay of an exponential moving average of the weights
            per update (Keras's optimizer `use_ema`; Marian's
            `--exponential-smoothing`), or None. The averages are
            `model.optimizer.moving_averages()`, and Keras's `fit` puts
            them into the weights at its end.
        count_tokens: also the `target_tokens` metric, the non-padding
            target tokens of the epoch so far, from which `ProgressLog`
            gives tokens/s (`train` counts them). Bookkeeping, not a
            score: left out of the progress bar and the history unless
            asked for.
        **optimizer_kwargs: more `keras.optimizers.Adam` arguments, or
            `record_gradient_norm=True` (`optimizers.Adam`: the last update's
            gradient norm in each step's logs, `gradient_norm`).

    Returns:
        `model`, compiled.
    """
    if steps_per_execution != 1 and keras.backend.backend() == "torch":
        raise ValueError(
            "Keras's torch backend runs one step per call of the train function. "
            f"Received: steps_per_execution={steps_per_execution}"
        )
    accumulate = check_count("accumulate", accumulate)
    replicas = _replicas(model)
    if ema is not None:
        if isinstance(ema, bool) or not isinstance(ema, (int, float)) or not 0.0 < ema < 1.0:
            raise ValueError(f"`ema` must be a decay in (0, 1), such as 0.9999. Received: ema={ema!r}")
        # Keras moves the average at every batch: N batches an update make
        # one update's decay.
        optimizer_kwargs |= {"use_ema": True, "ema_momentum": ema ** (1.0 / accumulate)}
    optimizer = transformer_adam(
        model.d_model, warmup_steps, learning_rate_scale, accumulate=accumulate, **optimizer_kwargs
    )
    if accumulate > 1 and replicas > 1 and not keras_private.accumulates_over_replicas(optimizer):
        # The cross-replica accumulation runs Keras's update in pieces (keras_private).
        raise ValueError(
            f"accumulate={accumulate} over {replicas} TensorFlow replicas needs Keras's optimizer methods "
            "that keras_transformer.backend.keras_private.ReplicaAccumulation calls, which this Keras "
            f"({keras.__version__}) lacks. Expected accumulate=1 there (more tokens per device instead), "
            "or the JAX backend, whose data parallelism accumulates."
        )
    if model.dtype_policy.name == "mixed_float16":
        # float16 gradients underflow without loss scaling.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=LabelSmoothedCrossEntropy(label_smoothing),
        metrics=[MaskedTokenAccuracy(), Perplexity()] + ([TargetTokens()] if count_tokens else []),
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def use_compilation_cache(directory=None):
    """Keeps XLA's compiled train and test steps on disk under JAX, so that a
    run repeated, resumed or run with another seed compiles nothing that an
    earlier one compiled (one program per batch shape).

    Args:
        directory: where; None: JAX's own `JAX_COMPILATION_CACHE_DIR` if set,
            else `$XDG_CACHE_HOME/keras-transformer/jax` (`~/.cache/...`).

    Returns:
        The cache directory, or None under another backend.
    """
    if keras.backend.backend() != "jax":
        return None
    import jax

    directory = directory or jax.config.jax_compilation_cache_dir or cache_directory("jax")
    jax.config.update("jax_compilation_cache_dir", os.fspath(directory))
    return directory


class StopOnNonFiniteLoss(StepHook):
    """Stops training when the loss is NaN or infinite, naming the step.

    Keras may run it on a thread of its own once each step's logs are on
    the host (`StepHook`), so the steps do not wait for it: it stops the run
    a step or two after the one it names, before the interval's checkpoint.
    """

    def __init__(self):
        super().__init__()
        self._guard = threading.Lock()

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._stopped = False

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or np.isfinite(loss):
            return
        with self._guard:  # the first step found says so, once
            if self._stopped:
                return
            self._stopped = True
        self.trained.stop_training = True
        raise FloatingPointError(
            f"The training loss became {loss} at step {self.step(batch)}. The last "
            "checkpoint before it is intact; lower the learning rate or "
            "check the data, then resume."
        )


class StopAtStep(keras.callbacks.Callback):
    """Ends training once the optimizer has taken `train_steps` steps.

    To stop at its step, it runs on the main thread, so Keras reads every
    step's logs back before the next step starts (a wait for the device);
    `fit` ends its runs with `model.fit`'s own step counts instead.
    """

    def __init__(self, train_steps):
        super().__init__()
        self.train_steps = train_steps

    def on_train_begin(self, logs=None):
        # Read once, then counted: no host sync per step.
        self._step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._step
        self._per_update = batches_per_update(self.model)

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: the epoch's last batch done (several a call with
        # `steps_per_execution`, several an update with accumulation).
        self._step = self._epoch_start + (batch + 1) // self._per_update
        if self._step >= self.train_steps:
            self.model.stop_training = True


def _moving_averages(model):
    """Whether the model's optimizer keeps moving averages of the weights."""
    optimizer = getattr(model, "optimizer", None)
    return bool(getattr(getattr(optimizer, "inner_optimizer", optimizer), "use_ema", False))


class TrainedWeights(keras.callbacks.Callback):
    """The trained weights at each epoch's end, before Keras's `fit` puts
    the moving averages in their place, for the next `fit` to go on from."""

    weights = None

    def on_epoch_end(self, epoch, logs=None):
        self.weights = [keras.ops.convert_to_numpy(v) for v in self.model.trainable_variables]

    def restore(self, model):
        if self.weights is not None:
            for variable, value in zip(model.trainable_variables, self.weights):
                variable.assign(value)


def batches_per_update(model):
    """The batches of each optimizer update of a compiled model: its
    optimizer's `gradient_accumulation_steps`, or 1."""
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # loss scaling
    return getattr(optimizer, "gradient_accumulation_steps", None) or 1


def steps_per_execution(*counts, most=8):
    """The largest power of two up to `most` that divides every count: steps
    per call of the train function for a run whose intervals (checkpoints,
    log lines, its end, the step it resumes from) are these counts, so that
    every interval ends at the end of a call."""
    per_call = most
    while per_call > 1 and any(count % per_call for count in counts):
        per_call //= 2
    return per_call


def _from_step(dataset, step):
    """The batches from batch `step` on: by index, without replaying those
    before it, where the dataset can."""
    if hasattr(dataset, "starting_at"):
        return dataset.starting_at(step)
    return dataset.skip(step)


def _fits(done, train_steps, checkpoint_every):
    """The `model.fit` calls that train from step `done` to `train_steps`,
    as (first step, initial epoch, epochs, steps an epoch): each ends where
    an interval or the run ends, so that no callback stops one mid-epoch
    (which would read every step's logs back). First up to the next multiple
    of `checkpoint_every` (a run that stopped at its `train_steps`, then was
    extended), then the whole intervals, then the last, shorter one."""
    while done < train_steps:
        epoch = done // checkpoint_every
        if done % checkpoint_every or train_steps - done < checkpoint_every:
            stop = min(train_steps, (epoch + 1) * checkpoint_every)
            yield done, epoch, epoch + 1, stop - done
        else:
            stop = train_steps - train_steps % checkpoint_every
            yield done, epoch, stop // checkpoint_every, checkpoint_every
        done = stop


def fit(
    model,
    dataset,
    model_dir,
    train_steps,
    checkpoint_every=1000,
    keep_checkpoints=5,
    validation_data=None,
    callbacks=(),
    verbose="auto",
    write=True,
    board=None,
    selection=None,
):
    """Trains for `train_steps` steps (optimizer updates, each of
    `compile_model`'s `accumulate` batches), resuming from `model_dir` if
    it can.

    Every `checkpoint_every` steps the model and its optimizer state are
    written to `model_dir/checkpoints/`, and the validation loss is computed.
    After a crash (even `kill -9`), calling `fit` again with the same
    arguments loads the newest checkpoint, so the step counter, the optimizer
    state and the learning-rate schedule continue where they were, and skips
    the batches already trained on. At most one interval is lost. Training
    stops at exactly `train_steps`, where a last checkpoint is written, even
    when `train_steps` is not a multiple of `checkpoint_every`. With a
    deterministic `dataset`, the result equals an uninterrupted run.

    Args:
        model: a compiled `Transformer` (see `compile_model`), built in the
            `Distribution` scope when training on several devices.
        dataset: endless batches: `TokenBatches`, such as
            `make_dataset(..., repeat=True, seed=0)`, or a `tf.data.Dataset`.
        model_dir: where checkpoints and TensorBoard logs (`logs/`) go.
        train_steps: the total number of optimizer steps.
        checkpoint_every: the checkpoint (and validation) interval, in steps.
        keep_checkpoints: how many checkpoints to keep, for averaging.
        validation_data: batches for the validation loss, or None.
        callbacks: more Keras callbacks. At an interval's end they run
            before its checkpoint is written. Under JAX and torch, one with a
            step hook (`on_train_batch_end`) that is not `async_safe` makes
            every step wait for the device, as Keras then reads each step's
            logs back before the next starts; `fit`'s own callbacks and
            `ProgressLog` let Keras do that on a thread of its own. Under
            TensorFlow Keras reads them on the main thread, once a call of
            `steps_per_execution` steps.
        verbose: the Keras progress-bar setting.
        write: False where another process of the run writes `model_dir`
            (the same weights: this one reads its checkpoints only).
        board: the `Board` the intervals' logs go to; None: one that `fit`
            opens in `model_dir/logs` (where it writes) and closes.
        selection: a callback that runs after each checkpoint is written,
            such as `BestCheckpoints`; training ends early where it (or
            any callback) sets `model.stop_training`.

    Returns:
        The trained model: `model`, or the one restored from a checkpoint.
    """
    train_steps = check_count("train_steps", train_steps)
    checkpoint_every = check_count("checkpoint_every", checkpoint_every)
    keep_checkpoints = check_count("keep_checkpoints", keep_checkpoints)
    checkpoint_dir = os.path.join(model_dir, "checkpoints")
    if write:
        check_writable(checkpoint_dir)
    # Under a TensorFlow strategy the checkpoint's variables must be the
    # strategy's too, or the restored model would train on one device.
    strategy = getattr(model, "distribute_strategy", None)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        restored = restore_latest(model, checkpoint_dir)
    if restored is not None:
        model = restored
    done = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    if done >= train_steps:
        return model
    per_update = batches_per_update(model)
    batched = getattr(dataset, "accumulate", per_update)
    if batched != per_update:
        raise ValueError(
            f"The model's optimizer makes an update of {per_update} batches (compile_model's accumulate), "
            f"and the batches are weighed for updates of {batched} (TokenBatches' accumulate); expected "
            "the same number."
        )
    per_call = getattr(model, "steps_per_execution", 1) or 1
    batches = [per_update * count for count in (train_steps, checkpoint_every, done)]
    if any(count % per_call for count in batches):
        raise ValueError(
            f"The model runs {per_call} batches per call of its train function (steps_per_execution), "
            f"which must divide the batches of train_steps, checkpoint_every and the step a run resumes "
            f"from ({per_update} a step), so that checkpoints fall where a call ends. Received: "
            f"train_steps={train_steps}, checkpoint_every={checkpoint_every}, resumed at step {done}. "
            f"Compile with steps_per_execution={steps_per_execution(*batches, most=per_call)}."
        )
    # The checkpoint comes last at an interval's end: what the other
    # callbacks record for a step (the history) is on disk before the
    # checkpoint that a resume starts from, and a resume redoes it.
    # The loss check comes after the others' step hooks, which see the
    # step it stops at (Keras skips the rest of a step's hooks once one raises).
    own_board = write and board is None
    if own_board:
        board = Board(os.path.join(model_dir, "logs"), resumed_at=done)
    callbacks = [*callbacks, StopOnNonFiniteLoss()] + ([WriteBoard(board)] if board is not None else [])
    if write:
        callbacks.append(SaveCheckpoints(checkpoint_dir, keep=keep_checkpoints))
    if selection is not None:
        callbacks.append(selection)
    # An epoch is one checkpoint interval: Keras validates and the callbacks
    # write a checkpoint at its end.
    # Keras's fit ends by putting the weights' moving averages (`use_ema`)
    # into the model; the next `fit` call goes on from the trained ones.
    trained = TrainedWeights() if _moving_averages(model) else None
    try:
        for start, epoch, epochs, steps in _fits(done, train_steps, checkpoint_every):
            if trained is not None:
                trained.restore(model)
            model.fit(
                _from_step(dataset, start * per_update),
                initial_epoch=epoch,
                epochs=epochs,
                steps_per_epoch=steps * per_update,
                validation_data=validation_data,
                callbacks=callbacks + ([trained] if trained is not None else []),
                verbose=verbose,
                shuffle=False,  # the dataset shuffles itself
            )
            if model.stop_training:  # early stopping: no more intervals
                break
    finally:
        if own_board:
            board.close()
    return model
