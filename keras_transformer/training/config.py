"""The configuration of a training run: one dataclass, its checks, and its
file (`train_config.json`), which `train --config` and `--resume` read."""

import dataclasses
import json
import math
import os

from keras_transformer.data.corpus import read_json_object
from keras_transformer.data.languages import check_code
from keras_transformer.data.languages import language_of_file
from keras_transformer.data.prepared import is_prepared
from keras_transformer.data.tokenizer import MODEL_FILE as VOCABULARY_FILE
from keras_transformer.files import write_atomically
from keras_transformer.models.presets import PRESETS
from keras_transformer.models.config import POSITION_TABLES
from keras_transformer.models.config import ModelConfig
from keras_transformer.training.limits import parse_duration
from keras_transformer.training.validation import DEFAULT_VALID_METRICS
from keras_transformer.training.validation import SCORERS
from keras_transformer.training.validation import VALID_METRICS

CONFIG_FILE = "train_config.json"
HISTORY_FILE = "history.jsonl"
# The training curve, a row per log line, readable without TensorFlow.
CURVE_FILE = "train_curve.csv"
# Where `train` prepares the training text it is given, once per run.
PREPARED_DIR = "data"

# The architecture fields `model` may hold.
MODEL_ARGUMENTS = tuple(ModelConfig.architecture_names())
DTYPES = ("float32", "mixed_bfloat16", "mixed_float16")


@dataclasses.dataclass
class TrainingConfig:
    """Everything a training run needs, as JSON-friendly values.

    Attributes:
        model_dir: where checkpoints, logs, the vocabulary and the trained
            translator go.
        train_source, train_target: training files, line-aligned (plain or
            .gz); lists are read one after the other. They are tokenized
            once into `model_dir/data/`, which a resumed run reads instead.
        train_data: a directory written by `prepare_dataset` (or
            `keras-transformer prepare`), in place of the training files;
            its vocabulary is the run's.
        valid_source, valid_target: validation files: the validation loss
            and greedy BLEU at each checkpoint, and nothing else.
        source_language, target_language: the codes of the languages
            translated between, saved with the translator (`serve` routes
            requests by them): by default the training files' suffixes
            (`train.en` and `train.de` give en and de), else those of the
            translator `init_from` names, else none.
        valid_fraction: instead of validation files, hold out this fraction
            of the training text's pairs (the same pairs for the same files)
            when it is prepared; they are kept as text in `model_dir/data/`.
        vocabulary: a directory holding `subword.model` to reuse; a new
            shared vocabulary of `vocabulary_size` pieces is trained on the
            training text when None.
        vocabulary_size: the size of a vocabulary trained here.
        init_from: a translator directory (trained here, or converted from
            a published model) to fine-tune: its model, weights and
            tokenizer, in place of `preset`, `model` and a vocabulary.
        preset: a `build_transformer` preset; `model` overrides its fields
            (`num_layers`, `d_model`, `d_ff`, `num_heads`, `dropout`,
            `attention_dropout`, `normalize_first`, `share_embeddings`, and
            Table 3's `key_dim`, `value_dim`, `position_encoding`,
            `max_length`, `attention_window`). Learned positions default to
            `max_length` = `max_tokens` + `max_extra_length`.
        dtype: `"float32"`, `"mixed_bfloat16"` or `"mixed_float16"`.
        tokens_per_batch: padded tokens per side per batch (section 5.1).
        bucket_step: each batch length is about this factor longer than the
            one before: 1.1 gives 35 lengths up to 128 tokens and little
            padding; 1.5 gives 8, for accelerators where each new shape
            costs a compilation (XLA on a GPU).
        buckets: at most this many batch lengths, fitted to the training
            pairs' lengths for the least padding (8 pad Multi30k by 7%,
            where `bucket_step` 1.5's 8 lengths pad it by 16%); replaces
            `bucket_step` when set. Validation batches come in at most 2
            lengths, fitted to the validation pairs, whatever these say.
        max_tokens: pairs with a side longer than this many subword tokens
            (EOS included) are left out of training; longer inputs are cut
            when translating.
        warmup_steps, learning_rate_scale: the schedule (section 5.3).
        label_smoothing: eps_ls (section 5.4).
        train_steps: optimizer updates in all.
        accumulate: batches per optimizer update: their gradients are
            summed and normalized by the target tokens of all of them, as
            one batch holding their sentences would be (fairseq's
            `--update-freq`). Every count of steps is of updates.
        checkpoint_every: updates between checkpoints (and validations).
        average: how many of the last checkpoints the final model averages
            (None: 5, or with `best_metric` the best ones instead).
        keep_checkpoints: how many of the last checkpoints stay on disk (None:
            `average`); at least `average`.
        valid_pairs: validate on the first this many pairs only (None:
            all of them).
        valid_bleu_sentences: validation sentences translated for BLEU and
            chrF at each checkpoint (0 turns it off; None takes them all).
        valid_metrics: what each validation scores, some of `loss`,
            `perplexity`, `bleu` and `chrf`.
        valid_beam_size, valid_alpha: the search of the validation's
            translations (None: the saved translator's, `beam_size` and
            `alpha`).
        best_metric: choose the translator by this validation metric (lower
            is better for loss and perplexity, higher for BLEU and chrF):
            the best checkpoint, or the average of the `average_best` best,
            instead of the average of the last ones.
        keep_best: how many of the best checkpoints stay in
            `checkpoints/best/` (None: `average_best`, or 1).
        average_best: average this many of the best checkpoints (None: 1).
        patience: stop after this many validations without a better
            `best_metric` (None: train to `train_steps`).
        tensorboard: where TensorBoard's event files go (None:
            `model_dir/logs`).
        max_epochs: stop after this many passes over the training pairs,
            if that comes before `train_steps`.
        max_time: stop after this long in one invocation (`90m`, `2h30m`,
            seconds), at an update's end, with a checkpoint; `--resume`
            goes on for as long again.
        clip_norm: scale each update's gradients down to this global norm
            where it is larger (Keras's `global_clipnorm`).
        ema: keep an exponential moving average of the weights with this
            decay per update (Marian's `--exponential-smoothing`); at the
            end it is validated beside the translator chosen otherwise, and
            saved instead where it scores better.
        subword_alpha: draw each training sentence's segmentation anew
            each time a batch holds it (subword regularization; for BPE,
            the probability that a merge is left out); validation and the
            saved translator keep the one segmentation.
        beam_size, alpha, max_extra_length: the saved translator's search.
        jit_compile: `"auto"`, True or False: XLA for the train step.
        seed: the seed of the weights, the dropout and the data order.
        log_every: a progress line every this many steps.
    """

    model_dir: str
    train_source: list
    train_target: list
    valid_source: list = dataclasses.field(default_factory=list)
    valid_target: list = dataclasses.field(default_factory=list)
    valid_fraction: float = None
    source_language: str = None
    target_language: str = None
    train_data: str = None
    vocabulary: str = None
    vocabulary_size: int = 8000
    init_from: str = None
    preset: str = "small"
    model: dict = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    tokens_per_batch: int = 4096
    bucket_step: float = 1.1
    buckets: int = None
    max_tokens: int = 128
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    label_smoothing: float = 0.1
    train_steps: int = 10000
    accumulate: int = 1
    checkpoint_every: int = 1000
    average: int = None
    keep_checkpoints: int = None
    valid_pairs: int = None
    valid_bleu_sentences: int = 500
    valid_metrics: list = dataclasses.field(default_factory=lambda: list(DEFAULT_VALID_METRICS))
    valid_beam_size: int = None
    valid_alpha: float = None
    best_metric: str = None
    keep_best: int = None
    average_best: int = None
    patience: int = None
    tensorboard: str = None
    max_epochs: int = None
    max_time: object = None
    clip_norm: float = None
    ema: float = None
    subword_alpha: float = None
    beam_size: int = 4
    alpha: float = 0.6
    max_extra_length: int = 50
    jit_compile: object = "auto"
    seed: int = 0
    log_every: int = 100

    def __post_init__(self):
        path = (str, os.PathLike)
        for name in ("train_source", "train_target", "valid_source", "valid_target"):
            value = getattr(self, name)
            value = [value] if isinstance(value, path) else value
            if not isinstance(value, (list, tuple)) or not all(isinstance(p, path) for p in value):
                raise TypeError(f"`{name}` must be a file path or a list of file paths; received {value!r}.")
            setattr(self, name, [os.fspath(p) for p in value])
        if isinstance(self.valid_metrics, str):
            self.valid_metrics = [self.valid_metrics]
        if isinstance(self.valid_metrics, (list, tuple)):
            self.valid_metrics = list(self.valid_metrics)
        for name in ("model_dir", "vocabulary", "train_data", "init_from", "tensorboard"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, path) or (name == "model_dir" and value is None):
                raise TypeError(f"`{name}` must be a folder's path; received {value!r}.")
            setattr(self, name, None if value is None else os.fspath(value))
        for name, files in (("source_language", self.train_source), ("target_language", self.train_target)):
            value = getattr(self, name)
            if value is None and files:
                value = language_of_file(files[0])
            setattr(self, name, None if value is None else check_code(value, f"`{name}`"))
        if not isinstance(self.model or {}, dict):
            raise TypeError(
                f"`model` must be an object of architecture fields, such as {{\"num_layers\": 3}}; "
                f"received {self.model!r}."
            )
        self.model = dict(self.model or {})

    # === Checks, before anything runs ===

    def validate(self):
        """Raises `ValueError` naming every field that is out of its domain,
        and `FileNotFoundError` for missing files."""
        problems = self.problems()
        if problems:
            raise ValueError("Invalid training configuration: " + "; ".join(problems) + ".")
        self._check_files()

    def problems(self):
        """What is wrong with the fields' values (types included), one line each."""
        problems = []

        def whole(name, least=1, value=None):
            value = getattr(self, name) if value is None else value
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                problems.append(f"{name} must be an integer >= {least}; received {value!r}")

        def number(name, low, high, value, low_open=False, high_open=True):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
            ok = ok and (value > low if low_open else value >= low)
            ok = ok and (value < high if high_open else value <= high)
            if not ok:
                left, right = "(" if low_open else "[", ")" if high_open else "]"
                problems.append(
                    f"{name} must be a number in {left}{low}, {high}{right}; received {value!r}"
                )

        for name in ("tokens_per_batch", "train_steps", "accumulate", "checkpoint_every",
                     "beam_size", "max_extra_length", "warmup_steps", "log_every"):
            whole(name)
        for name in ("average", "valid_beam_size", "keep_best", "average_best"):
            if getattr(self, name) is not None:
                whole(name)
        if self.patience is not None:
            whole("patience", 0)
        if self.valid_alpha is not None:
            number("valid_alpha", 0, math.inf, self.valid_alpha)
        if self.max_epochs is not None:
            whole("max_epochs")
        if self.clip_norm is not None:
            number("clip_norm", 0, math.inf, self.clip_norm, low_open=True)
        if self.ema is not None:
            number("ema", 0, 1, self.ema, low_open=True)
        if self.subword_alpha is not None:
            number("subword_alpha", 0, 1, self.subword_alpha, low_open=True, high_open=False)
        if self.max_time is not None:
            try:
                parse_duration(self.max_time)
            except ValueError as error:
                problems.append(f"max_time: {error}")
        problems += self._selection_problems()
        whole("max_tokens", 2)
        whole("vocabulary_size", 300 if self.vocabulary is None else 1)
        whole("seed", 0)
        if self.valid_bleu_sentences is not None:
            whole("valid_bleu_sentences", 0)
        if self.valid_pairs is not None:
            whole("valid_pairs")
        if self.keep_checkpoints is not None:
            whole("keep_checkpoints")
            last = self.last_averaged()
            if isinstance(self.keep_checkpoints, int) and isinstance(last, int) and self.keep_checkpoints < last:
                problems.append(
                    f"keep_checkpoints ({self.keep_checkpoints}) must be at least average ({last}), "
                    "the checkpoints the final model averages"
                )
        if self.buckets is not None:
            whole("buckets")
            if isinstance(self.buckets, int) and self.buckets > 64:
                problems.append(f"buckets must be at most 64; received {self.buckets}")
        number("learning_rate_scale", 0, math.inf, self.learning_rate_scale, low_open=True)
        number("label_smoothing", 0, 1, self.label_smoothing)
        number("bucket_step", 1, 4, self.bucket_step, high_open=False)
        if self.valid_fraction is not None:
            number("valid_fraction", 0, 1, self.valid_fraction, low_open=True)
        number("alpha", 0, math.inf, self.alpha)
        if isinstance(self.tokens_per_batch, int) and isinstance(self.max_tokens, int):
            if self.tokens_per_batch < self.max_tokens:
                problems.append(
                    f"tokens_per_batch ({self.tokens_per_batch}) must hold at least one "
                    f"pair of max_tokens ({self.max_tokens}) tokens"
                )
        if not isinstance(self.preset, str) or self.preset not in PRESETS:
            problems.append(f"preset must be one of {sorted(PRESETS)}; received {self.preset!r}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {list(DTYPES)}; received {self.dtype!r}")
        if self.jit_compile not in ("auto", True, False):
            problems.append(f"jit_compile must be 'auto', true or false; received {self.jit_compile!r}")
        unknown = sorted(set(self.model) - set(MODEL_ARGUMENTS))
        if unknown:
            problems.append(f"model has unknown fields {unknown}; expected some of {list(MODEL_ARGUMENTS)}")
        architecture = {}
        if isinstance(self.preset, str) and self.preset in PRESETS and not unknown:
            architecture = self.architecture()
            problems += ModelConfig(**architecture).problems(prefix="model.")
        if not problems and architecture.get("position_encoding") in POSITION_TABLES and architecture["max_length"] < self.max_tokens:
            problems.append(
                f"model.max_length ({architecture['max_length']}) must be at least max_tokens "
                f"({self.max_tokens}), so that every training pair has a position for each token"
            )
        return problems

    def _selection_problems(self):
        """What is wrong with the validation and the choice of the model."""
        problems = []
        metrics = self.valid_metrics
        if not isinstance(metrics, list) or not metrics or not all(m in VALID_METRICS for m in metrics):
            problems.append(f"valid_metrics must name some of {list(VALID_METRICS)}; received {metrics!r}")
        elif len(set(metrics)) != len(metrics):
            problems.append(f"valid_metrics names a metric twice; received {metrics!r}")
        chosen = self.best_metric is not None
        if chosen and self.best_metric not in VALID_METRICS:
            problems.append(f"best_metric must be one of {list(VALID_METRICS)}; received {self.best_metric!r}")
        elif chosen and isinstance(metrics, list) and self.best_metric not in metrics:
            problems.append(f"best_metric {self.best_metric!r} must be one of valid_metrics {metrics}")
        elif chosen and self.best_metric in SCORERS and self.valid_bleu_sentences == 0:
            problems.append(f"best_metric {self.best_metric!r} scores translations, which valid_bleu_sentences 0 turns off")
        if chosen and self.average is not None:
            problems.append(
                f"average ({self.average}) averages the last checkpoints, and best_metric chooses the best; "
                "give one of them (average_best N averages the N best)"
            )
        for name in ("keep_best", "average_best", "patience"):
            if not chosen and getattr(self, name) is not None:
                problems.append(f"{name} needs best_metric, the validation metric that says which is best")
        keep, average = self.keep_best, self.average_best
        if all(isinstance(n, int) for n in (keep, average)) and average > keep:
            problems.append(f"average_best ({average}) must be at most keep_best ({keep}), the best checkpoints kept")
        return problems

    def last_averaged(self):
        """How many of the last checkpoints the translator averages (None:
        it is chosen by `best_metric` instead)."""
        if self.average is not None:
            return self.average
        return None if self.best_metric is not None else 5

    def best_kept(self):
        """How many of the best checkpoints stay in `checkpoints/best/`."""
        return self.keep_best or self.average_best or 1

    def _check_files(self):
        if self.train_data is not None:
            if self.train_source or self.train_target:
                raise ValueError(
                    "Give either train_data (a prepared directory) or train_source and "
                    f"train_target (text files), not both; received train_data={self.train_data!r} "
                    f"and {self.train_source} | {self.train_target}."
                )
            if not is_prepared(self.train_data):
                raise FileNotFoundError(
                    f"No prepared dataset in {self.train_data}: expected the manifest.json that "
                    "`keras-transformer prepare` writes last."
                )
            if self.vocabulary is not None:
                raise ValueError(
                    f"train_data {self.train_data} brings its own vocabulary; received "
                    f"vocabulary={self.vocabulary!r} too."
                )
        if self.valid_fraction is not None:
            if self.valid_source or self.valid_target or self.train_data is not None:
                raise ValueError(
                    "valid_fraction holds validation pairs out of the training text files; give it "
                    "without valid_source and valid_target, and with train_source and train_target "
                    f"(not train_data). Received: valid_source={self.valid_source}, "
                    f"valid_target={self.valid_target}, train_data={self.train_data!r}."
                )
        sides = ("train", "valid") if self.valid_fraction is None else ("train",)
        for side in sides if self.train_data is None else ("valid",):
            sources, targets = getattr(self, f"{side}_source"), getattr(self, f"{side}_target")
            if not sources or len(sources) != len(targets):
                raise ValueError(
                    f"{side}_source and {side}_target must name the same number of files "
                    f"(at least one each); received {sources} and {targets}."
                )
            for path in sources + targets:
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"No such file: {path} (a {side} file).")
        if self.init_from is not None:
            if not os.path.isfile(os.path.join(self.init_from, "model.keras")):
                raise FileNotFoundError(
                    f"No translator to start from in {self.init_from}: expected the model.keras that "
                    "`train` or `convert` writes."
                )
            if self.vocabulary is not None or self.model:
                raise ValueError(
                    f"init_from {self.init_from} brings its model and vocabulary; received "
                    f"vocabulary={self.vocabulary!r} and model={self.model} too."
                )
        if self.vocabulary is not None:
            path = os.path.join(self.vocabulary, VOCABULARY_FILE)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"No vocabulary to reuse in {self.vocabulary}: expected {VOCABULARY_FILE} "
                    "(written by SubwordTokenizer.save, or a model directory)."
                )

    def architecture(self):
        """The `build_transformer` arguments, preset and overrides merged."""
        architecture = PRESETS[self.preset] | self.model
        if architecture.get("position_encoding") in POSITION_TABLES and architecture.get("max_length") is None:
            architecture["max_length"] = self.max_tokens + self.max_extra_length
        return architecture

    # === JSON ===

    def to_dict(self):
        return dataclasses.asdict(self)

    def save(self, directory=None):
        """Writes `train_config.json` into `directory` (the model dir)."""
        directory = directory or self.model_dir
        os.makedirs(directory, exist_ok=True)
        write_atomically(
            os.path.join(directory, CONFIG_FILE), json.dumps(self.to_dict(), indent=2) + "\n"
        )

    @classmethod
    def from_dict(cls, values, source="the configuration"):
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        missing = sorted(
            field.name
            for field in dataclasses.fields(cls)
            if field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
            and field.name not in values
        )
        if unknown or missing:
            raise ValueError(
                f"{source} does not describe a training run: unknown fields {unknown}, "
                f"missing fields {missing}."
            )
        try:
            config = cls(**values)
        except TypeError as error:
            raise ValueError(f"{source}: {error}") from None
        problems = config.problems()
        if problems:
            raise ValueError(f"{source}: " + "; ".join(problems) + ".")
        return config

    @classmethod
    def load(cls, path):
        """Reads a configuration: a `train_config.json`, or a model dir."""
        path = cls.config_path(path)
        return cls.from_dict(read_json_object(path), source=path)

    @classmethod
    def read_fields(cls, path):
        """The fields a configuration file gives, some or all of them (the
        JSON object of `train_config.json`, or a part of one); the rest come
        from elsewhere (`train`'s options). Unknown fields are refused."""
        path = cls.config_path(path)
        values = read_json_object(path)
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"{path}: unknown fields {unknown}; a configuration takes some of {names}.")
        return values

    @staticmethod
    def config_path(path):
        """`path`, or the `train_config.json` in it when it is a folder."""
        if os.path.isdir(path):
            path = os.path.join(path, CONFIG_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"No training configuration at {path}: expected the {CONFIG_FILE} "
                "that a training run writes into its model directory, or a JSON object of some of its fields."
            )
        return path
