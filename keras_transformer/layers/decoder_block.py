"""One layer of the decoder stack, section 3.1."""

import keras
from keras import ops

from keras_transformer.layers.transformer_block import TransformerBlock
from keras_transformer.layers.utils import sublayer_connection


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoderBlock(TransformerBlock):
    """Masked self-attention, encoder-decoder attention, then a feed-forward
    network (section 3.1).

    Each sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x))), or in
    pre-LN form with `normalize_first=True`. The self-attention is causal:
    position t attends to positions <= t only, so the prediction at t cannot
    see the target tokens after it. Arguments are those of
    `TransformerBlock`.

    For step-by-step decoding, pass a self-attention cache (the keys and
    values of the positions decoded so far, in a buffer of fixed length) with
    the index of the new positions, and the encoder's keys and values from
    `compute_cross_attention_cache`. The block then returns its output and
    the updated self-attention cache.

    In a beam search the K beams of a sentence share its source, so the
    cross-attention cache may hold one copy per sentence: with `inputs` of
    `[B * K, T, d_model]` (row `b * K + k` is beam k of sentence b) and a
    cache of `[B, ...]`, the block attends to the source with the K beams'
    queries side by side, `[B, K * T, d_model]`. The encoder's keys and
    values are then read once per sentence instead of once per beam.

    Call arguments:
        inputs: `[B, T, d_model]`, the shifted target embeddings.
        encoder_output: `[B, S, d_model]`. May be None when
            `cross_attention_cache` is given.
        decoder_padding_mask: boolean `[B, T]`, False at target padding.
        encoder_padding_mask: boolean `[B, S]`, False at source padding.
        self_attention_cache: a `(key, value)` pair of
            `[B, num_heads, T_max, head_dim]`.
        self_attention_cache_update_index: where `inputs` starts in the cache.
        cross_attention_cache: a `(key, value)` pair of
            `[B, num_heads, S, head_dim]`, or of `[B / K, ...]` shared by
            the K beams of each sentence.
        encoder_padding_mask: then `[B / K, S]`, with the cache.
        return_cross_attention_scores: also return the encoder-decoder
            attention weights, `[B, num_heads, T, S]`.
        training: whether dropout is active.
        decoding: the `backend.options.DecodingOptions` of a compiled decoding call, or None.

    Returns:
        `[B, T, d_model]`; then the cross-attention weights if asked for;
        then the updated self-attention cache if one was given.
    """

    def build(self, inputs_shape, encoder_output_shape=None):
        encoder_output_shape = encoder_output_shape or inputs_shape
        self.self_attention = self._attention(
            "self_attention", window=self.attention_window
        )
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm", inputs_shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.cross_attention = self._attention("cross_attention")
        self.cross_attention.build(inputs_shape, encoder_output_shape)
        self.cross_attention_norm = self._norm(
            "cross_attention_norm", inputs_shape
        )
        self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self.feed_forward = self._feed_forward()
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm = self._norm("feed_forward_norm", inputs_shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def compute_cross_attention_cache(self, encoder_output, decoding=None):
        """The encoder's keys and values, computed once per sentence."""
        return self.cross_attention.compute_key_value(encoder_output, decoding=decoding)

    def call(
        self,
        inputs,
        encoder_output=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_cross_attention_scores=False,
        training=None,
        decoding=None,
    ):
        if encoder_output is None and cross_attention_cache is None:
            raise ValueError(
                "The decoder block attends to the encoder, so it needs "
                "`encoder_output` or `cross_attention_cache`. Received: "
                "encoder_output=None, cross_attention_cache=None"
            )
        updated_cache = None
        cross_attention_scores = None

        def masked_self_attention(x):
            nonlocal updated_cache
            if self_attention_cache is None:
                return self.self_attention(
                    x,
                    x,
                    value_mask=decoder_padding_mask,
                    use_causal_mask=True,
                    training=training,
                    decoding=decoding,
                )
            x, updated_cache = self.self_attention(
                x,
                x,
                use_causal_mask=True,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
                training=training,
                decoding=decoding,
            )
            return x

        def encoder_decoder_attention(x):
            nonlocal cross_attention_scores
            queries = x
            if cross_attention_cache is not None:
                queries = self._group_beams(x, cross_attention_cache[0])
            outputs = self.cross_attention(
                queries,
                encoder_output,
                value_mask=encoder_padding_mask,
                return_attention_scores=return_cross_attention_scores,
                cache=cross_attention_cache,
                training=training,
                decoding=decoding,
            )
            if not isinstance(outputs, tuple):
                outputs = (outputs,)
            attended = outputs[0]
            if return_cross_attention_scores:
                cross_attention_scores = outputs[1]
            if cross_attention_cache is not None:  # back to one row per beam
                attended = ops.reshape(attended, ops.shape(x))
                if return_cross_attention_scores:
                    cross_attention_scores = self._ungroup_scores(
                        cross_attention_scores, x
                    )
            return attended

        def feed_forward(x):
            return self.feed_forward(x, decoding=decoding)

        x = inputs
        for sublayer, norm, dropout in (
            (
                masked_self_attention,
                self.self_attention_norm,
                self.self_attention_dropout,
            ),
            (
                encoder_decoder_attention,
                self.cross_attention_norm,
                self.cross_attention_dropout,
            ),
            (feed_forward, self.feed_forward_norm, self.feed_forward_dropout),
        ):
            x = sublayer_connection(
                x, sublayer, norm, dropout, self.normalize_first, training, decoding
            )
        outputs = (x,)
        if return_cross_attention_scores:
            outputs += (cross_attention_scores,)
        if self_attention_cache is not None:
            outputs += (updated_cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    @staticmethod
    def _group_beams(x, cached_key):
        """`[B * K, T, d]` queries as `[B, K * T, d]`, for a cache of `[B, ...]`."""
        queries, sentences = x.shape[0], cached_key.shape[0]
        if isinstance(queries, int) and isinstance(sentences, int) and queries % sentences:
            raise ValueError(
                "The decoder's batch must be the cross-attention cache's batch "
                "times the beams per sentence. Received: inputs of batch "
                f"{queries} and a cross-attention cache of batch {sentences}"
            )
        return ops.reshape(x, (ops.shape(cached_key)[0], -1, ops.shape(x)[-1]))

    @staticmethod
    def _ungroup_scores(scores, x):
        """`[B, N, K * T, S]` weights of grouped queries as `[B * K, N, T, S]`."""
        batch, heads, _, source_length = ops.shape(scores)
        length = ops.shape(x)[1]
        scores = ops.reshape(scores, (batch, heads, -1, length, source_length))
        scores = ops.transpose(scores, (0, 2, 1, 3, 4))
        return ops.reshape(scores, (-1, heads, length, source_length))

    def compute_output_shape(self, inputs_shape, encoder_output_shape=None):
        return inputs_shape
