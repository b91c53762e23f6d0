"""The search's settings: one value that carries every decoding option from
the command line, the server and `Translator` down to the compiled search.

A field is written once, here: its default, its check, its command-line
flag and help (`add_arguments`), its place in `translator.json`
(`get_config`), and the logits processors it turns on (`processors`).
"""

import dataclasses
import math
import numbers

# The forms of the length penalty: GNMT's, the paper's; |Y| ** alpha.
LENGTH_PENALTIES = ("gnmt", "power")


def _field(default, help, flag=True, **argument):
    """A setting; with `flag`, also a command-line flag (`--beam-size` for
    `beam_size`), whose `argument`s are `add_argument`'s."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "argument": argument})


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """How a translator searches (the paper's search is the default:
    section 6.1, beam 4, alpha 0.6, source length + 50).

    Change one with `replace`; `Translator(..., beam_size=1)` and
    `translator.with_search(beam_size=1)` take the same names.
    """

    # Hypotheses kept per sentence; 1 searches greedily.
    beam_size: int = _field(4, "hypotheses kept per sentence; 1 searches greedily", type=int, metavar="N")
    # The length penalty's exponent; 0 ranks by log-probability.
    alpha: float = _field(0.6, "length penalty exponent", type=float)
    # "gnmt": lp = ((5 + |Y|) / 6)^alpha (the paper's); "power": |Y|^alpha.
    length_penalty: str = _field(
        "gnmt", "((5 + length) / 6)^alpha, the paper's, or length^alpha, fairseq's and Marian's",
        choices=LENGTH_PENALTIES,
    )
    # When a beam search's sentence is done (transformers' early_stopping):
    # "never" (exact), False (a guess at the current length) or True (that,
    # or beam_size hypotheses finished). `convert` reads a checkpoint's.
    early_stopping: object = _field("never", "when a beam is done: never (exact, the paper's), false (bounded at the "
                                    "current length) or true (also once beam-size hypotheses finished), as transformers'",
                                    type=lambda text: EARLY_STOPPING_FLAGS.get(text, text), metavar="never|true|false")
    # An output may have this many tokens more than its source.
    max_extra_length: int = _field(50, "output tokens allowed beyond the source's", type=int, metavar="N")
    # An output holds at least this many tokens, its EOS included, where its
    # limit allows (transformers' and fairseq's min_length; 0: no bound).
    min_length: int = _field(0, "the fewest tokens of an output, its EOS included (transformers' min_length)",
                             type=int, metavar="N")
    # Scores of tokens an output already holds, divided by it (multiplied
    # where negative): transformers' and CTranslate2's; 1: none.
    repetition_penalty: float = _field(1.0, "tokens an output holds score / R where positive, x R where not "
                                       "(transformers' and CTranslate2's repetition_penalty)", type=float, metavar="R")
    # No n-gram of this many tokens twice in an output (0: none).
    no_repeat_ngram_size: int = _field(0, "no n-gram of N tokens twice in an output", type=int, metavar="N")
    # "topk:K" or "topp:P": each token drawn from the K best or from the
    # nucleus of probability P (CTranslate2's sampling_topk and
    # sampling_topp); one translation per sentence. None: the search.
    sampling: str = _field(None, "draw each token from the K best or the nucleus of probability P, not the "
                           "search's best (one translation per sentence)", metavar="topk:K|topp:P")
    # Logits are divided by it before sampling.
    temperature: float = _field(1.0, "logits / T before sampling", type=float, metavar="T")
    # The samples' seed: the same seed, input and batch size draw the same.
    seed: int = _field(0, "the samples' seed", type=int)
    # EOS at an output's limit (transformers' forced_eos_token_id; `convert` sets it).
    force_eos: bool = _field(False, "end with EOS an output that reaches its limit", flag=False)
    # Ids that begin every output (a multilingual model's target language).
    target_prefix: tuple = _field((), "target ids every output begins with", flag=False)

    def __post_init__(self):
        for name, least in (("beam_size", 1), ("max_extra_length", 1), ("min_length", 0), ("no_repeat_ngram_size", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}. Received: {name}={value!r}")
            object.__setattr__(self, name, int(value))
        self._check_sampling()
        penalty = self.repetition_penalty
        if isinstance(penalty, bool) or not isinstance(penalty, numbers.Real) or not 0 < penalty < math.inf:
            raise ValueError(f"repetition_penalty must be a finite number above 0. Received: repetition_penalty={penalty!r}")
        object.__setattr__(self, "repetition_penalty", float(penalty))
        check_alpha(self.alpha)
        check_early_stopping(self.early_stopping)
        object.__setattr__(self, "alpha", float(self.alpha))
        check_length_penalty(self.length_penalty)
        object.__setattr__(self, "force_eos", bool(self.force_eos))
        prefix = [] if self.target_prefix is None else self.target_prefix
        if isinstance(prefix, str) or len(prefix) >= self.max_extra_length or not all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) and i > 0 for i in prefix):
            raise ValueError(
                f"target_prefix must be a list of fewer than max_extra_length={self.max_extra_length} token ids "
                f"above 0. Received: target_prefix={prefix!r}"
            )
        object.__setattr__(self, "target_prefix", tuple(int(i) for i in prefix))

    def _check_sampling(self):
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not 0 < temperature < math.inf:
            raise ValueError(f"temperature must be a finite number above 0. Received: temperature={temperature!r}")
        object.__setattr__(self, "temperature", float(temperature))
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"seed must be an integer. Received: seed={self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed) & 0xFFFFFFFF)
        if self.sampling is None:
            if self.temperature != 1.0:
                raise ValueError(f"temperature={self.temperature} applies to sampling; set sampling (topk:K or topp:P) too.")
            return
        kind, _, value = str(self.sampling).partition(":")
        try:
            number = int(value) if kind == "topk" else float(value) if kind == "topp" else None
        except ValueError:
            number = None
        if number is None or (kind == "topk" and number < 1) or (kind == "topp" and not 0 < number <= 1):
            raise ValueError(
                "sampling must be topk:K with an integer K >= 1 or topp:P with 0 < P <= 1. "
                f"Received: sampling={self.sampling!r}"
            )

    def sampler(self):
        """The `sampling.Sampler` of a sampling search, or None."""
        if self.sampling is None:
            return None
        from keras_transformer.decoding.sampling import Sampler  # sampling imports selection

        kind, _, value = self.sampling.partition(":")
        return Sampler(k=int(value) if kind == "topk" else None, p=float(value) if kind == "topp" else None,
                       temperature=self.temperature, seed=self.seed)

    @classmethod
    def names(cls):
        return tuple(field.name for field in dataclasses.fields(cls))

    def replace(self, **changes):
        """These settings with `changes` (field names), checked."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise TypeError(f"Unknown search settings {unknown}; expected some of {list(self.names())}.")
        return dataclasses.replace(self, **changes)

    def get_config(self):
        config = dataclasses.asdict(self)
        config["target_prefix"] = list(self.target_prefix) or None
        return config

    @classmethod
    def from_config(cls, config):
        return cls().replace(**config)

    def processors(self, eos_id, start_id):
        """The logits processors these settings turn on, in the order they
        apply (`decoding.processors`); none with the defaults. `start_id`:
        the id BOS counts as in an output (`processors.output_ids`)."""
        from keras_transformer.decoding import processors  # processors import this module's constants

        found = []
        if self.repetition_penalty != 1.0:
            found.append(processors.RepetitionPenalty(self.repetition_penalty, start_id))
        if self.no_repeat_ngram_size > 0:
            found.append(processors.NoRepeatNgram(self.no_repeat_ngram_size, start_id))
        if self.min_length > 0:
            found.append(processors.MinLength(self.min_length, eos_id))
        return tuple(found)


def add_arguments(parser, saved=True):
    """A flag for each field that has one: `--beam-size` for `beam_size`.
    A flag not given is None, so that a translator's saved setting holds."""
    defaults = SearchSettings()
    for field in dataclasses.fields(SearchSettings):
        if not field.metadata["flag"]:
            continue
        default = getattr(defaults, field.name)
        parser.add_argument(
            "--" + field.name.replace("_", "-"), default=None, **field.metadata["argument"],
            help=f"{field.metadata['help']} ({'saved ' if saved else ''}default: {default})",
        )


def from_arguments(args):
    """The search settings parsed arguments give (`add_arguments`): a dict
    of the fields whose flags were given."""
    return {
        field.name: getattr(args, field.name) for field in dataclasses.fields(SearchSettings)
        if field.metadata["flag"] and getattr(args, field.name, None) is not None
    }


EARLY_STOPPING_FLAGS = {"never": "never", "true": True, "false": False}


def check_early_stopping(value):
    if value not in ("never", True, False) or isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(f"early_stopping must be 'never', True or False. Received: early_stopping={value!r}")


def check_length_penalty(form):
    if form not in LENGTH_PENALTIES:
        raise ValueError(
            f"length_penalty must be one of {list(LENGTH_PENALTIES)}. Received: length_penalty={form!r}"
        )


def check_alpha(alpha):
    """The length penalty exponent must be a finite number >= 0: early
    stopping relies on lp growing with length, and a NaN alpha makes every
    score NaN, so that no search ends before its maximum length."""
    if (
        not isinstance(alpha, numbers.Real)
        or isinstance(alpha, bool)
        or not math.isfinite(alpha)
        or alpha < 0
    ):
        raise ValueError(
            f"alpha must be a finite number >= 0. Received: alpha={alpha!r}"
        )

