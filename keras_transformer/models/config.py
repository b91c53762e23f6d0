"""What describes a Transformer: one dataclass, its checks, and its flags.

`ModelConfig` holds section 3's sizes and Table 3's options. `Transformer`
takes its fields as arguments and returns them from `get_config`;
`TrainingConfig.model` holds any of its architecture fields; `train`'s
model flags are made from them. Each field's range is checked here, once.
"""

import dataclasses
import math
import numbers

POSITION_ENCODINGS = ("sinusoidal", "learned", "table")
# The encodings read from a table of `max_length` rows, which bounds lengths.
POSITION_TABLES = ("learned", "table")
# The feed-forward activations: the paper's ReLU; GELU and swish (SiLU), which
# published translators of the same architecture use (OPUS-MT: swish).
ACTIVATIONS = ("relu", "gelu", "swish")
# Dropout seeds are stored in 32 bits (JAX's seed dtype) with room for the
# per-layer offsets.
MAX_SEED = 2**30


def _field(default, help=None, least=None, optional=False, **metadata):
    """A field with its range (`least` for integers) and its flag's help
    (None: no flag)."""
    return dataclasses.field(
        default=default, metadata={"help": help, "least": least, "optional": optional, **metadata}
    )


@dataclasses.dataclass
class ModelConfig:
    """The architecture of a Transformer (section 3, Table 3).

    Attributes:
        vocabulary_size: the shared source and target vocabulary.
        num_layers: N, the blocks in each stack.
        d_model: the width of every sub-layer's output.
        d_ff: the inner width of the feed-forward networks.
        num_heads: h, the attention heads.
        key_dim: d_k, per head; d_model / h when None (Table 3 A, B).
        value_dim: d_v, per head; d_k when None.
        position_encoding: "sinusoidal" or "learned" (Table 3 E), or "table":
            a fixed table of `max_length` positions, the paper's sinusoids
            until a converted checkpoint loads its own layout into it.
        max_length: the positions of a "learned" or "table" encoding.
        attention_window: restricted self-attention: each query attends to
            keys at most this many positions away (section 4); None
            attends to all.
        dropout: P_drop, on each sub-layer's output and on the embeddings.
        attention_dropout: dropout on the attention weights.
        normalize_first: pre-LN blocks, x + Sublayer(LayerNorm(x)), instead
            of the paper's LayerNorm(x + Sublayer(x)).
        share_embeddings: one matrix for the source and target embeddings
            and the pre-softmax projection (section 3.4).
        layer_norm_epsilon: the epsilon of every layer normalization.
        activation: the feed-forward networks' inner activation: ReLU in
            the paper (section 3.3), swish in OPUS-MT.
        decoder_d_ff: the decoder's feed-forward inner width; d_ff when
            None (fairseq's WMT19 models have 8192 and 4096).
        output_bias: a learned bias added to the logits (Marian's).
        share_target_embeddings: without `share_embeddings`, one matrix for
            the target embedding and the pre-softmax projection, the source
            embedding apart.
        seed: the seed of the dropout streams; drawn when None.
    """

    vocabulary_size: int = _field(None, least=1)
    num_layers: int = _field(6, "blocks in each stack", least=1)
    d_model: int = _field(512, "model width", least=1)
    d_ff: int = _field(2048, "feed-forward inner width", least=1)
    num_heads: int = _field(8, "attention heads", least=1)
    key_dim: int = _field(None, "d_k, per head (default d_model / num_heads; Table 3 A, B)", least=1, optional=True)
    value_dim: int = _field(None, "d_v, per head (default key_dim)", least=1, optional=True)
    position_encoding: str = _field("sinusoidal", "Table 3 E (default sinusoidal)", choices=POSITION_ENCODINGS)
    max_length: int = _field(
        None, "positions learned with --position-encoding learned (default max_tokens + max_extra_length)",
        least=1, optional=True,
    )
    attention_window: int = _field(
        None, "restricted self-attention: keys at most this many positions away (section 4)", least=0, optional=True
    )
    dropout: float = _field(0.1, "P_drop", unit_interval=True)
    attention_dropout: float = _field(0.0, "dropout on attention weights", unit_interval=True)
    normalize_first: bool = _field(False, "pre-LN blocks instead of the paper's post-LN", boolean=True)
    share_embeddings: bool = _field(True, "one matrix for both embeddings and the output projection", boolean=True)
    layer_norm_epsilon: float = _field(1e-6, positive=True)
    activation: str = _field("relu", "feed-forward activation (default relu, the paper's)", choices=ACTIVATIONS)
    decoder_d_ff: int = _field(None, "the decoder's feed-forward inner width (default d_ff)", least=1, optional=True)
    output_bias: bool = _field(False, "a learned bias on the logits", boolean=True)
    share_target_embeddings: bool = _field(
        False, "with --share-embeddings false: one matrix for the target embedding and the output projection",
        boolean=True,
    )
    seed: int = _field(None)

    @classmethod
    def names(cls):
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def architecture_names(cls):
        """The fields a training configuration's `model` may set: all but
        the vocabulary (the run's own) and the seed (the run's seed)."""
        return [name for name in cls.names() if name not in ("vocabulary_size", "seed")]

    @classmethod
    def flags(cls):
        """`(name, help, metadata)` of the fields that `train` takes as flags."""
        return [(f.name, f.metadata["help"], f.metadata) for f in dataclasses.fields(cls) if f.metadata["help"]]

    def problems(self, prefix=""):
        """What is wrong with the fields, one line each, each field named
        (after `prefix`, such as "model.") with the value received."""
        found = []
        for field in dataclasses.fields(self):
            problem = _field_problem(field, getattr(self, field.name))
            if problem:
                found.append(f"{prefix}{field.name} must be {problem}. Received: {field.name}={getattr(self, field.name)!r}")
        if found:
            return found
        if self.position_encoding in POSITION_TABLES and self.max_length is None:
            found.append(
                f"{prefix}position_encoding={self.position_encoding!r} holds one vector per position, so it "
                "needs max_length, the most positions of a source or a target. Received: max_length=None"
            )
        if self.position_encoding == "sinusoidal" and self.max_length is not None:
            found.append(
                f"{prefix}max_length bounds learned positions or a table; sinusoids have no maximum. "
                "Pass position_encoding='learned' or 'table' with it, or leave it out. Received: "
                f"position_encoding='sinusoidal', max_length={self.max_length!r}"
            )
        if self.key_dim is None and self.d_model % self.num_heads:
            found.append(
                f"{prefix}d_model must be divisible by num_heads, so that every head has "
                "d_k = d_model / num_heads, or key_dim must be given. "
                f"Received: d_model={self.d_model}, num_heads={self.num_heads}"
            )
        if self.share_embeddings and self.share_target_embeddings:
            found.append(
                f"{prefix}share_target_embeddings shares the target embedding with the output projection "
                "when share_embeddings is false; share_embeddings=True already shares all three. "
                "Received: share_embeddings=True, share_target_embeddings=True"
            )
        return found

    def check(self):
        """Raises ValueError with the first problem, if any."""
        problems = self.problems()
        if problems:
            raise ValueError(problems[0])
        return self


def _field_problem(field, value):
    """What `value` must be for `field`, or None if it is that."""
    metadata = field.metadata
    if field.name == "seed":
        if value is None or (_is_integer(value) and 0 <= value <= MAX_SEED):
            return None
        return f"an integer in [0, {MAX_SEED}]"
    if value is None and metadata["optional"]:
        return None
    if metadata["least"] is not None:
        least = metadata["least"]
        if _is_integer(value) and value >= least:
            return None
        return f"an integer >= {least}" + (" or None" if metadata["optional"] else "")
    if metadata.get("choices"):
        return None if value in metadata["choices"] else f"one of {list(metadata['choices'])}"
    if metadata.get("boolean"):
        return None if isinstance(value, bool) else "true or false"
    if metadata.get("unit_interval"):
        return None if _is_real(value) and 0 <= value < 1 else "a number in [0, 1)"
    if metadata.get("positive"):
        return None if _is_real(value) and 0 < value < math.inf else "a positive finite number"
    return None


def _is_integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
