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
        train_steps: optimizer steps in all.
        checkpoint_every: steps between checkpoints (and validations).
        average: how many of the last checkpoints the final model averages.
        keep_checkpoints: how many of the last checkpoints stay on disk (None:
            `average`); at least `average`.
        valid_pairs: validate on the first this many pairs only (None:
            all of them).
        valid_bleu_sentences: validation sentences translated for BLEU at
            each checkpoint (0 turns it off; None takes them all).
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
    checkpoint_every: int = 1000
    average: int = 5
    keep_checkpoints: int = None
    valid_pairs: int = None
    valid_bleu_sentences: int = 500
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
        for name in ("model_dir", "vocabulary", "train_data", "init_from"):
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

        for name in ("tokens_per_batch", "train_steps", "checkpoint_every", "average",
                     "beam_size", "max_extra_length", "warmup_steps", "log_every"):
            whole(name)
        whole("max_tokens", 2)
        whole("vocabulary_size", 300 if self.vocabulary is None else 1)
        whole("seed", 0)
        if self.valid_bleu_sentences is not None:
            whole("valid_bleu_sentences", 0)
        if self.valid_pairs is not None:
            whole("valid_pairs")
        if self.keep_checkpoints is not None:
            whole("keep_checkpoints")
            if isinstance(self.keep_checkpoints, int) and isinstance(self.average, int) and self.keep_checkpoints < self.average:
                problems.append(
                    f"keep_checkpoints ({self.keep_checkpoints}) must be at least average ({self.average}), "
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
