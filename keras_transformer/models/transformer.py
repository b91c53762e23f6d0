"""The encoder-decoder Transformer of section 3, as a Functional model."""

import dataclasses

import keras
import numpy as np
from keras import ops

from keras_transformer.backend import shapes
from keras_transformer.checks import TokenIdCheck
from keras_transformer.checks import check_model_inputs
from keras_transformer.layers import Dropout, LearnedPositionEmbedding, LogitsBias, SinusoidalPositionEncoding
from keras_transformer.layers import SinusoidalTable, TokenEmbedding, TransformerDecoderBlock, TransformerEncoderBlock
from keras_transformer.layers.dense import LayerNormalization
from keras_transformer.models.checked_data import CheckedData
from keras_transformer.models.compile_settings import CompiledAsAsked
from keras_transformer.models.config import MAX_SEED
from keras_transformer.models.config import POSITION_TABLES
from keras_transformer.models.config import ModelConfig
from keras_transformer.models.presets import PRESETS
from keras_transformer.models.quantization import quantization_mode
from keras_transformer.models.quantization import quantize_in_place

PADDING_ID = 0
# A block makes at most this many dropout layers (a decoder block: five).
SEEDS_PER_BLOCK = 8
RANDOM_STATE_KEY = "random_state_"


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(CompiledAsAsked, CheckedData, keras.Model):
    """The Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    A Functional model from `{"source_ids": [B, S], "target_ids": [B, T]}` to
    next-token logits `[B, T, vocabulary_size]` (float32). `target_ids` is the
    target shifted right (it starts with BOS), so the logits at position t
    predict target token t. Id 0 is padding in both inputs.

    Each input is embedded (section 3.4), scaled by sqrt(d_model), added to
    the sinusoidal position encoding (section 3.5) or to learned position
    embeddings (Table 3, row E), and passed through dropout. A stack of `num_layers` encoder blocks encodes the source; a
    stack of decoder blocks attends to it and to the earlier target
    positions. The logits are the decoder output times the transposed
    embedding matrix, which the source embedding, the target embedding and
    this projection share by default.

    For decoding, `encode`, `initial_cache` and `decode_step` run the same
    layers one target position at a time, caching keys and values.

    Args:
        vocabulary_size: the size of the (shared) vocabulary.
        dtype: the dtype policy, such as `"mixed_bfloat16"`.
        **kwargs: the fields of `ModelConfig` (num_layers, d_model, d_ff,
            num_heads, key_dim, value_dim, position_encoding, max_length,
            attention_window, dropout, attention_dropout, normalize_first,
            share_embeddings, layer_norm_epsilon, activation, decoder_d_ff,
            output_bias, share_target_embeddings, seed), with its defaults:
            the base model. A seed of None draws one from NumPy's global
            generator, which `keras.utils.set_random_seed` seeds; each
            dropout layer draws from its own stream derived from it, and
            the streams' positions are saved with the weights, so a model
            restored from a checkpoint drops out as the saved one would
            have next. Then base model arguments, such as `name`.
    """

    def __init__(self, vocabulary_size, dtype=None, **kwargs):
        fields = {name: kwargs.pop(name) for name in ModelConfig.names() if name in kwargs}
        config = ModelConfig(vocabulary_size=vocabulary_size, **fields).check()
        if config.seed is None:
            # NumPy's generator, not Python's: Keras draws its initializers'
            # seeds from Python's, and a draw here would change them.
            config.seed = int(np.random.randint(0, MAX_SEED))
        # Until Keras's init, attributes are set plainly (`__setattr__`).
        object.__setattr__(self, "_making_layers", True)
        self.config = config

        # === Layers ===
        self.source_id_check = TokenIdCheck(
            config.vocabulary_size, "source_ids", name="source_id_check"
        )
        self.target_id_check = TokenIdCheck(
            config.vocabulary_size, "target_ids", name="target_id_check"
        )
        def embedding(name):
            return TokenEmbedding(config.vocabulary_size, config.d_model, dtype=dtype, name=name)

        if config.share_embeddings:
            self.source_embedding = self.target_embedding = self.output_projection = embedding("token_embedding")
        else:
            self.source_embedding = embedding("source_embedding")
            self.target_embedding = embedding("target_embedding")
            self.output_projection = (
                self.target_embedding if config.share_target_embeddings else embedding("output_projection")
            )
        self.logits_bias = (
            LogitsBias(config.vocabulary_size, dtype=dtype, name="logits_bias") if config.output_bias else None
        )
        if config.position_encoding == "sinusoidal":
            self.source_position_encoding = self.target_position_encoding = (
                SinusoidalPositionEncoding(dtype=dtype, name="position_encoding")
            )
        elif config.position_encoding == "table":
            # Fixed, one table for both stacks: the paper's sinusoids until a
            # converted checkpoint loads its own layout.
            self.source_position_encoding = self.target_position_encoding = LearnedPositionEmbedding(
                int(config.max_length), embeddings_initializer=SinusoidalTable(), trainable=False,
                dtype=dtype, name="position_table",
            )
        else:
            self.source_position_encoding = LearnedPositionEmbedding(
                int(config.max_length), dtype=dtype, name="source_position_embedding"
            )
            self.target_position_encoding = LearnedPositionEmbedding(
                int(config.max_length), dtype=dtype, name="target_position_embedding"
            )
        self.source_dropout = Dropout(
            config.dropout, seed=config.seed, dtype=dtype, name="source_dropout"
        )
        self.target_dropout = Dropout(
            config.dropout, seed=config.seed + 1, dtype=dtype, name="target_dropout"
        )
        # The blocks take every field but the embeddings' and the positions'.
        block_arguments = {
            name: getattr(config, name)
            for name in ("num_heads", "activation", "dropout", "attention_dropout", "normalize_first",
                         "layer_norm_epsilon", "key_dim", "value_dim", "attention_window")
        }
        block_arguments["dtype"] = dtype
        # Block k's dropouts are seeded from seed + SEEDS_PER_BLOCK * (k + 1).
        self.encoder_blocks = [
            TransformerEncoderBlock(
                **block_arguments,
                d_ff=config.d_ff,
                seed=config.seed + SEEDS_PER_BLOCK * (i + 1),
                name=f"encoder_block_{i}",
            )
            for i in range(config.num_layers)
        ]
        self.decoder_blocks = [
            TransformerDecoderBlock(
                **block_arguments,
                d_ff=config.decoder_d_ff or config.d_ff,
                seed=config.seed + SEEDS_PER_BLOCK * (config.num_layers + i + 1),
                name=f"decoder_block_{i}",
            )
            for i in range(config.num_layers)
        ]
        # A pre-LN stack ends on an unnormalized residual sum.
        self.encoder_norm = self.decoder_norm = None
        if config.normalize_first:
            self.encoder_norm = LayerNormalization(
                epsilon=config.layer_norm_epsilon, dtype=dtype, name="encoder_norm"
            )
            self.decoder_norm = LayerNormalization(
                epsilon=config.layer_norm_epsilon, dtype=dtype, name="decoder_norm"
            )

        # === Functional model ===
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in ("source_ids", "target_ids")
        }
        outputs = self._forward(inputs)
        object.__setattr__(self, "_making_layers", False)
        super().__init__(
            inputs=inputs,
            outputs=outputs,
            dtype=dtype,
            **kwargs,
        )

        # The Functional init does not keep `dtype`; the model's own policy
        # decides the cache dtype and, in `compile_model`, loss scaling.
        if dtype is not None:
            self.dtype_policy = keras.dtype_policies.get(dtype)

        # === Config ===
        for name, value in dataclasses.asdict(config).items():
            setattr(self, name, value)

    # === Inputs, checked before Keras casts them to int32 ===
    def __call__(self, inputs, *args, **kwargs):
        inputs = check_model_inputs(inputs, self.vocabulary_size)
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, training=None, mask=None, **kwargs):
        # JAX's trainer runs `stateless_call`, which calls `call` directly.
        inputs = check_model_inputs(inputs, self.vocabulary_size)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def _forward(self, inputs, training=None):
        """The logits of `{"source_ids", "target_ids"}`: the encoder stack on
        the source, the decoder stack on the target and the encoder output,
        and the pre-softmax projection (Figure 1). Symbolic inputs make the
        Functional graph; tensors, in direct calls, the logits."""
        encoder_output, encoder_padding_mask = self._encode(
            self.source_id_check(inputs["source_ids"]), training=training
        )
        target_ids = self.target_id_check(inputs["target_ids"])
        return self._logits(self._decode(target_ids, encoder_output, encoder_padding_mask, training))

    def _decode(self, target_ids, encoder_output, encoder_padding_mask, training=None, decoding=None):
        """The decoder stack's states `[B, T, d_model]` over all of `target_ids`."""
        x = self.target_dropout(self._embed_target(target_ids, decoding=decoding), training=training, decoding=decoding)
        decoder_padding_mask = ops.not_equal(target_ids, PADDING_ID)
        for block in self.decoder_blocks:
            x = block(
                x,
                encoder_output,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                training=training,
                decoding=decoding,
            )
        return x

    def __setattr__(self, name, value):
        # The layers are made before `super().__init__()`, whose Functional
        # graph then tracks them. Until that init, set attributes plainly:
        # torch's nn.Module refuses sublayers before its own init has run.
        if self.__dict__.get("_making_layers"):
            return object.__setattr__(self, name, value)
        return super().__setattr__(name, value)

    def _embed_source(self, source_ids, decoding=None):
        """E[ids] * sqrt(d_model) + PE, section 3.5."""
        x = self.source_embedding(source_ids, decoding=decoding)
        return x + self.source_position_encoding(x, decoding=decoding)

    def _embed_target(self, target_ids, start_index=0, position_table=None, decoding=None):
        """E[ids] * sqrt(d_model) + PE, from position `start_index` on; PE
        read from `position_table` when given."""
        x = self.target_embedding(target_ids, decoding=decoding)
        if position_table is None:
            return x + self.target_position_encoding(x, start_index=start_index, decoding=decoding)
        length = ops.shape(target_ids)[1]
        return x + shapes.slice(position_table, [start_index, 0], [length, self.d_model], decoding)[None]

    def target_position_table(self, max_length):
        """The target position encodings of positions `0 .. max_length - 1`,
        `[max_length, d_model]`, for `decode_step(..., position_table=...)`."""
        positions = ops.zeros((1, max_length, self.d_model), dtype=self.compute_dtype)
        return self.target_position_encoding(positions)[0]

    def _encode(self, source_ids, training=None, decoding=None):
        encoder_padding_mask = ops.not_equal(source_ids, PADDING_ID)
        x = self._embed_source(source_ids, decoding)
        x = self.source_dropout(x, training=training, decoding=decoding)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=encoder_padding_mask, training=training, decoding=decoding)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x, decoding=decoding)
        return x, encoder_padding_mask

    def _logits(self, x, decoding=None):
        if self.decoder_norm is not None:
            x = self.decoder_norm(x, decoding=decoding)
        # float32 logits keep the softmax and the loss exact under mixed
        # precision.
        logits = self.output_projection(x, reverse=True, float32=True, decoding=decoding)
        return logits if self.logits_bias is None else self.logits_bias.add_to_new(logits, decoding)

    def encode(self, source_ids, training=False, decoding=None):
        """Runs the encoder stack alone.

        Args:
            source_ids: int `[B, S]`, 0 at padding.
            training: whether dropout is active.
            decoding: the `backend.options.DecodingOptions` of the
                decoding call this runs in, or None (`decode_step` too).

        Returns:
            `(encoder_output [B, S, d_model], encoder_padding_mask [B, S])`.
        """
        return self._encode(self.source_id_check(source_ids, decoding=decoding), training=training, decoding=decoding)

    def initial_cache(self, encoder_output, max_length, decoding=None):
        """The decoding cache before the first target position.

        Self-attention keys and values start as zeros, in buffers of
        `max_length` positions that `decode_step` fills one position at a
        time. Cross-attention keys and values are computed from the encoder
        output here, once per sentence.

        Args:
            encoder_output: `[B, S, d_model]` from `encode`.
            max_length: the most target positions that will be decoded.

        Returns:
            A list with one dict per decoder block, holding
            `"self_attention"` and `"cross_attention"` `(key, value)` pairs of
            `[B, num_heads, max_length or S, d_k or d_v]`. Every
            tensor has the batch as its first dimension, so a beam search can
            reorder the cache with one gather per tensor.
        """
        if self.position_encoding in POSITION_TABLES and isinstance(max_length, int) and max_length > self.max_length:
            raise ValueError(
                f"The model's {self.position_encoding} positions end at max_length={self.max_length}, "
                f"so it cannot decode max_length={max_length} target positions. "
                f"Expected max_length <= {self.max_length}."
            )
        batch_size = ops.shape(encoder_output)[0]
        key_dim = self.key_dim or self.d_model // self.num_heads
        value_dim = self.value_dim or key_dim

        def empty(head_dim):
            return ops.zeros(
                (batch_size, self.num_heads, max_length, head_dim),
                dtype=self.compute_dtype,
            )

        return [
            {
                "self_attention": (empty(key_dim), empty(value_dim)),
                "cross_attention": block.compute_cross_attention_cache(
                    encoder_output, decoding=decoding
                ),
            }
            for block in self.decoder_blocks
        ]

    def decode_step(self, target_ids, cache, index, encoder_padding_mask, position_table=None, decoding=None):
        """Logits for target positions `index, index + 1, ...`, from the cache.

        The prefix is not recomputed: the self-attention of each block reads
        the cached keys and values of positions < `index` and writes those of
        the new positions.

        Args:
            target_ids: int `[B, t]`, the target tokens at positions
                `index .. index + t - 1` (t is 1 when decoding step by step).
            cache: from `initial_cache` or the previous `decode_step`.
            index: the position of the first of `target_ids` (an int or a
                scalar tensor).
            encoder_padding_mask: boolean `[B, S]` from `encode`.
            position_table: optional, `target_position_table(max_length)`,
                computed once for a whole search. The step then reads its
                position encodings instead of computing sines and cosines.
                (XLA on TensorFlow fused that computation into each of the
                first block's projections of a single row, recomputing it
                for every output: greedy search at batch 1 ran slower than
                beam search.)
            decoding: as for `encode`; in a search's step under direct calls
                (`DecodingOptions.step`) the search's own buffers are written in place.

        A beam search may decode K beams per sentence, `target_ids` of
        `[B * K, t]` (row `b * K + k` is beam k of sentence b), with
        self-attention buffers of `[B * K, ...]` and the `[B, ...]`
        cross-attention keys and values and padding mask of `encode` and
        `initial_cache`, which the beams share.

        Returns:
            `(logits [B, t, vocabulary_size], cache)`.
        """
        _check_cache_index(index, target_ids, cache)
        x = self._embed_target(target_ids, start_index=index, position_table=position_table, decoding=decoding)
        updated_cache = []
        for block, block_cache in zip(self.decoder_blocks, cache):
            x, self_attention_cache = block(
                x,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=block_cache["self_attention"],
                self_attention_cache_update_index=index,
                cross_attention_cache=block_cache["cross_attention"],
                training=False,
                decoding=decoding,
            )
            updated_cache.append(
                {
                    "self_attention": self_attention_cache,
                    "cross_attention": block_cache["cross_attention"],
                }
            )
        return self._logits(x, decoding), updated_cache

    def cross_attention_weights(self, source_ids, target_ids):
        """The encoder-decoder attention weights of every decoder block.

        Args:
            source_ids: int `[B, S]`, 0 at padding.
            target_ids: int `[B, T]`, the shifted target (BOS first).

        Returns:
            A list with one `[B, num_heads, T, S]` tensor per decoder block:
            how much target position t attends to source position s.
        """
        encoder_output, encoder_padding_mask = self.encode(source_ids)
        x = self._embed_target(target_ids)
        decoder_padding_mask = ops.not_equal(target_ids, PADDING_ID)
        weights = []
        for block in self.decoder_blocks:
            x, block_weights = block(
                x,
                encoder_output,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                return_cross_attention_scores=True,
                training=False,
            )
            weights.append(block_weights)
        return weights

    def get_config(self):
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            **dataclasses.asdict(self.config),
        }
        mode = quantization_mode(self)
        if mode is not None:
            # The layers are rebuilt quantized, so that the int8 kernels load.
            config["quantization_mode"] = mode
        return config

    # === Saving ===
    def _random_states(self):
        """The positions of the dropout streams: the variables that are not
        weights (Keras keeps them out of `weights` and out of its saving)."""
        weights = {id(weight) for weight in self.weights}
        return [v for v in self.variables if id(v) not in weights]

    def save_own_variables(self, store):
        super().save_own_variables(store)
        for i, state in enumerate(self._random_states()):
            store[f"{RANDOM_STATE_KEY}{i}"] = state

    def load_own_variables(self, store):
        """Loads the dropout streams' positions too, when the file has them
        (files written by earlier versions do not)."""
        random_keys = [k for k in store.keys() if k.startswith(RANDOM_STATE_KEY)]
        super().load_own_variables(
            {k: store[k] for k in store.keys() if k not in random_keys}
        )
        states = self._random_states()
        if random_keys and len(random_keys) != len(states):
            raise ValueError(
                f"The file holds {len(random_keys)} dropout states, but this "
                f"model has {len(states)}: it was saved from another model."
            )
        for i, state in enumerate(states if random_keys else []):
            state.assign(store[f"{RANDOM_STATE_KEY}{i}"])

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        mode = config.pop("quantization_mode", None)
        model = cls(**config)
        if mode is not None:
            quantize_in_place(model, mode)
        return model


def build_transformer(preset="base", **overrides):
    """Builds a `Transformer` from a preset of Table 3, with any field changed.

    Args:
        preset: `"base"` or `"big"` (Table 3), or `"small"` or `"tiny"`
            for small corpora and CPUs; see `PRESETS`.
        **overrides: `Transformer` arguments that replace the preset's, such
            as `vocabulary_size=8000` or `dtype="mixed_bfloat16"`.

    Returns:
        A `Transformer`, which is a `keras.Model`.

    Example:
        >>> model = build_transformer("base", vocabulary_size=37000)
    """
    if preset not in PRESETS:
        raise ValueError(
            f"Unknown preset. Expected one of {sorted(PRESETS)}. "
            f"Received: preset={preset!r}"
        )
    accepted = set(ModelConfig.names()) | {"dtype", "name"}
    unknown = sorted(set(overrides) - accepted)
    if unknown:
        raise ValueError(
            f"Unknown Transformer argument(s) {unknown}. Expected some of "
            f"{sorted(accepted)}. Received: overrides={overrides}"
        )
    return Transformer(**(PRESETS[preset] | overrides))


def _check_cache_index(index, target_ids, cache):
    """A known `index` must leave its positions inside the cache: an update
    past it would write the last slot and return logits as if it held.
    (A traced index is the search loop's own, kept in range there.)"""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not cache:
        return
    slots = cache[0]["self_attention"][0].shape[2]
    steps = target_ids.shape[1]
    if slots is None or steps is None:
        return
    if not 0 <= index <= slots - steps:
        raise ValueError(
            f"`index` must be from 0 to {slots - steps} for {steps} target position(s) in a cache of "
            f"{slots} positions (initial_cache's max_length). Received: index={index}"
        )
