"""Multi-head attention, section 3.2 of "Attention Is All You Need"."""

import math

import keras
from keras import ops

from keras_transformer.backend import attention
from keras_transformer.backend import norms
from keras_transformer.backend import products
from keras_transformer.backend import shapes
from keras_transformer.backend.options import memoized
from keras_transformer.backend.shapes import reshape
from keras_transformer.backend.shapes import slice_update
from keras_transformer.layers.calls import DirectCalls
from keras_transformer.layers.dense import EinsumDense
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.utils import clone_initializer


class _ConcatenatedHeadsDense(EinsumDense):
    """W^O on the concatenated heads: `[T, N, H]` -> `[T, d_model]`.

    The kernel keeps `EinsumDense`'s `[N, H, d_model]` shape. The product
    is written as Concat(head_1, ..., head_h) W^O, a `[T, N * H]` by
    `[N * H, d_model]` matrix product, rather than as an einsum over (n, h).
    The two are the same arithmetic, but XLA laid the einsum's kernel out
    anew (a transpose of the whole kernel) at every call, which in a
    decoding loop is every step: a tenth of a greedy step of the base model
    under JAX. `kernel` includes a LoRA update when one is enabled; quantized
    kernels take `EinsumDense`'s own quantized call.
    """

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes subclasses only when told that their float `call`
        # is all they change; the quantized call is EinsumDense's.
        super().quantize(mode, type_check=False, config=config)

    def call(self, inputs, training=None, decoding=None):
        kernel = self.kernel
        num_heads, head_dim, d_model = kernel.shape
        concatenated = reshape(inputs, (-1, num_heads * head_dim))
        kernel = reshape(kernel, (num_heads * head_dim, d_model))
        biased = products.biased_product(concatenated, kernel, self.bias, decoding=decoding)
        if biased is not None:
            return biased
        x = products.matmul(concatenated, kernel, decoding)
        if self.bias is not None:
            biased = norms.add_bias(x, self.bias, decoding)
            x = ops.add(x, self.bias) if biased is None else biased
        return x


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(DirectCalls, keras.layers.Layer):
    """Multi-head scaled dot-product attention (section 3.2).

        Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

    The constructor and `call` mirror `keras.layers.MultiHeadAttention`, and
    the weights have the same shapes and order (query, key, value, output),
    so one layer can stand in for the other. Two things are added:

    - `key_dim` defaults to d_model / num_heads, as in the paper
      (d_k = d_v = d_model / h).
    - Incremental decoding. Self-attention writes the keys and values of new
      target positions into a fixed-size cache at `cache_update_index`.
      Cross-attention takes the encoder's keys and values, computed once by
      `compute_key_value`, as a cache with no update index. The cache keeps
      each head's keys together, `[B, N, S, H]`, the layout in which the
      scores Q K^T of every head are one batched product. With the tokens'
      own `[B, S, N, H]` layout, XLA copied every cached key and value into
      that layout again at every decoding step: a third of a beam search's
      time under JAX.

    - Restricted self-attention (section 4, Table 1). With `window=r`,
      query t attends only to keys s with |t - s| <= r, a neighbourhood of
      2r + 1 positions (r + 1 under the causal mask). It is a band mask on
      the full T x S scores: it shows what the restriction does to a model,
      but costs as much as unrestricted attention here, where the paper's
      O(r n d) per layer would need the scores of the band alone.

    The fused `keras.ops.dot_product_attention` computes the attention unless
    the weights are requested, attention dropout is active, d_k != d_v, or
    the keys come from a cache, where the softmax is written out. (The fused
    operation takes `[B, S, N, H]` keys only; TensorFlow without XLA would
    copy a cache into that layout and back. Torch's own fused attention
    takes the cache's layout, and torch decoding calls use it.)

    Args:
        num_heads: h, the number of attention heads.
        key_dim: d_k, the size of each head for queries and keys. Defaults to
            d_model / num_heads, where d_model is the size of the query.
        value_dim: d_v, the size of each head for values. Defaults to
            `key_dim`.
        dropout: dropout rate on the attention weights.
        use_bias: whether the four projections have biases.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        seed: seed of the attention dropout.
        window: r, the farthest a key may be from its query, in positions;
            None attends to every position.
        **kwargs: base layer arguments, such as `name` and `dtype`.

    Call arguments:
        query: `[B, T, d_model]`.
        value: `[B, S, d_value]`. Ignored when `cache` holds precomputed
            cross-attention keys and values.
        key: `[B, S, d_key]`; defaults to `value`.
        query_mask: boolean `[B, T]`, filled from the Keras mask of `query`.
        value_mask: boolean `[B, S]`, filled from the Keras mask of `value`.
            False marks padding that no query attends to.
        key_mask: boolean `[B, S]`, filled from the Keras mask of `key`.
        attention_mask: boolean `[B, T, S]`; True where query t may attend to
            key s.
        use_causal_mask: mask future positions, so that query t only attends
            to keys s <= t (shifted by `cache_update_index` when caching).
        return_attention_scores: also return the attention weights
            `[B, num_heads, T, S]`.
        training: whether attention dropout is active.
        cache: a `(key, value)` pair of `[B, num_heads, S_cache, head_dim]`.
            With `cache_update_index`, the keys and values of `value` are
            written into it at that position (self-attention). Without, it is
            used as it is (cross-attention).
        cache_update_index: the position of the first query in the cache.
        decoding: the `backend.options.DecodingOptions` of a compiled decoding call, or None.

    Returns:
        `[B, T, d_model]`, then the attention weights if
        `return_attention_scores`, then the updated `(key, value)` cache if
        `cache` was given.
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value, least in (
            ("num_heads", num_heads, 1),
            ("key_dim", key_dim, 1),
            ("value_dim", value_dim, 1),
            ("window", window, 0),
        ):
            if value is None and name != "num_heads":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(
                    f"`{name}` must be an integer >= {least}"
                    + ("" if name == "num_heads" else " or None")
                    + f". Received: {name}={value!r}"
                )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.window = window
        self.supports_masking = True

    def _projection(self, equation, output_shape, bias_axes, name, layer=EinsumDense):
        return layer(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (
            ("query", query_shape),
            ("value", value_shape),
            ("key", key_shape),
        ):
            if len(shape) != 3:
                raise ValueError(
                    f"`{name}` must have shape [batch, length, features]. "
                    f"Received: {name}.shape={tuple(shape)}"
                )
        d_model = query_shape[-1]
        if self.key_dim is None and d_model % self.num_heads != 0:
            raise ValueError(
                "d_model must be divisible by num_heads so that "
                "d_k = d_model / num_heads is a whole number, or `key_dim` "
                f"must be given. Received: d_model={d_model}, "
                f"num_heads={self.num_heads}"
            )
        self._key_dim = self.key_dim or d_model // self.num_heads
        self._value_dim = self.value_dim or self._key_dim
        self._inverse_sqrt_key_dim = 1.0 / math.sqrt(self._key_dim)

        # W^Q, W^K, W^V for all heads at once: [d, num_heads, head_dim]. The
        # projections act on tokens, whatever sentence they belong to (see
        # `_per_token`).
        self.query_dense = self._projection(
            "td,dnh->tnh", (self.num_heads, self._key_dim), "nh", "query"
        )
        self.query_dense.build((None, query_shape[-1]))
        self.key_dense = self._projection(
            "sd,dnh->snh", (self.num_heads, self._key_dim), "nh", "key"
        )
        self.key_dense.build((None, key_shape[-1]))
        self.value_dense = self._projection(
            "sd,dnh->snh", (self.num_heads, self._value_dim), "nh", "value"
        )
        self.value_dense.build((None, value_shape[-1]))
        # W^O maps the concatenated heads back to d_model.
        self.output_dense = self._projection(
            "tnh,nhd->td", (d_model,), "d", "attention_output", _ConcatenatedHeadsDense
        )
        self.output_dense.build((None, self.num_heads, self._value_dim))
        self.attention_dropout = Dropout(
            self.dropout,
            seed=self.seed,
            dtype=self.dtype_policy,
            name="attention_dropout",
        )
        self.built = True

    def compute_key_value(self, value, key=None, decoding=None):
        """Projects `key` and `value` once, for use as a cross-attention cache.

        Returns:
            `(key, value)`, each `[B, num_heads, S, head_dim]`.
        """
        return tuple(
            ops.transpose(heads, (0, 2, 1, 3))
            for heads in self._project_key_value(value, key, decoding)
        )

    def _project_key_value(self, value, key=None, decoding=None):
        """`(key, value)` heads, each `[B, S, num_heads, head_dim]`."""
        key = value if key is None else key
        return (
            self._per_token(self.key_dense, key, decoding),
            self._per_token(self.value_dense, value, decoding),
        )

    @staticmethod
    def _per_token(projection, x, decoding=None):
        """`projection` of every token of x `[B, T, ...]`, as one matrix product.

        The B sentences' tokens are stacked into one `[B * T, ...]` matrix,
        so that each projection and its gradients are single 2-D products on
        every backend. (On `[B, T, d]` itself, TensorFlow broadcasts a
        batched product over B and sums the kernel's gradient over it: a
        fifth of the time of a base-size training step on a CPU.)
        """
        batch_and_length = tuple(shapes.shape(x)[:2])
        projected = projection(reshape(x, (-1,) + tuple(x.shape[2:])), decoding=decoding)
        return reshape(projected, batch_and_length + tuple(projected.shape[1:]))

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
        decoding=None,
    ):
        # Keras masks carried by the inputs (the `_keras_mask` attribute of
        # the Keras masking guide) are merged into the attention mask below.
        # The projections see `[B * T, d]` reshapes, which carry no mask, so
        # they do not warn that they drop one.
        query_heads = self._per_token(self.query_dense, query, decoding)  # [B, T, N, H]
        if cache is None:
            key_heads, value_heads = self._project_key_value(value, key, decoding)  # [B, S, N, H]
        elif cache_update_index is None:
            key_heads, value_heads = cache  # [B, N, S, H], computed once
        else:
            start = [0, 0, cache_update_index, 0]
            key_heads, value_heads = (
                slice_update(cached, start, new, decoding)
                for cached, new in zip(cache, self.compute_key_value(value, key, decoding))
            )
            cache = (key_heads, value_heads)
        heads_major = cache is not None

        masks = dict(
            query_length=shapes.shape(query_heads)[1],
            value_length=shapes.shape(key_heads)[2 if heads_major else 1],
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            cache_update_index=cache_update_index,
        )
        # The layers of a stack get the same masks: in a torch search's
        # step, they are merged once a step (`DecodingOptions.step`).
        mask = memoized(
            decoding, ("attention_mask", self.window), tuple(masks.values()), lambda: self._compute_attention_mask(**masks)
        )
        attention_dropout_active = bool(training) and self.dropout > 0
        # JAX's fused attention takes values of the keys' head size only.
        fused = self._key_dim == self._value_dim
        scores = None
        if return_attention_scores or attention_dropout_active or not fused:
            attended, scores = self._softmax_attention(
                query_heads, key_heads, value_heads, mask, training, heads_major
            )
        elif heads_major:
            attended = self._attend_to_cache(query_heads, key_heads, value_heads, mask, decoding)
        else:
            attended = attention.dot_product_attention(
                query_heads, key_heads, value_heads, mask, self._inverse_sqrt_key_dim, decoding
            )
        if mask is not None:
            # A query that may attend to no key (a padded query) attends to
            # nothing, instead of to every key uniformly.
            attended = attention.zero_where_no_key(attended, mask, decoding)
        output = self._per_token(self.output_dense, attended, decoding)  # [B, T, d_model]

        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        """`[B, T, d_model]`, the query's shape, whatever B and T are."""
        return tuple(query_shape)

    def compute_output_spec(self, query, value, key=None, return_attention_scores=False, cache=None, **kwargs):
        """What `call` returns, from the inputs' shapes alone: no length is
        compared, so a Functional model's `None` lengths pass under every
        backend."""
        outputs = (keras.KerasTensor(self.compute_output_shape(query.shape, value.shape), dtype=self.compute_dtype),)
        if return_attention_scores:
            keys = (key if key is not None else value).shape[1] if cache is None else cache[0].shape[2]
            scores_shape = (query.shape[0], self.num_heads, query.shape[1], keys)
            outputs += (keras.KerasTensor(scores_shape, dtype=self.compute_dtype),)
        if cache is not None:
            outputs += (tuple(keras.KerasTensor(part.shape, dtype=part.dtype) for part in cache),)
        return outputs[0] if len(outputs) == 1 else outputs

    def _attend_to_cache(self, query, key, value, mask, decoding):
        """Attention of `[B, T, N, H]` queries over a `[B, N, S, H]` cache,
        at inference: torch's fused attention where it takes this layout
        (`backend.attention`), else written out."""
        attended = attention.attend_to_cache(query, key, value, mask, self._inverse_sqrt_key_dim, decoding)
        if attended is None:
            attended = self._softmax_attention(query, key, value, mask, False, heads_major=True)[0]
        return attended

    def _softmax_attention(self, query, key, value, mask, training, heads_major=False):
        """softmax(Q K^T / sqrt(d_k)) V, written out to expose the weights.

        `query` is `[B, T, N, H]`; `key` and `value` are `[B, S, N, H]`, or
        `[B, N, S, H]` when `heads_major` (a cache).
        """
        if heads_major:
            # Decoding computes the scores in float32, as JAX's fused
            # attention does: in bfloat16 they tie often enough that the
            # order of rounding chose between beams.
            query, key = ops.cast(query, "float32"), ops.cast(key, "float32")
        query = ops.multiply(
            query, ops.cast(self._inverse_sqrt_key_dim, query.dtype)
        )
        keys = "bnsh" if heads_major else "bsnh"
        scores = ops.einsum(f"btnh,{keys}->bnts", query, key)  # [B, N, T, S]
        # The softmax runs in float32 so that float16 logits cannot overflow.
        scores = ops.cast(scores, "float32")
        if mask is not None:
            scores = ops.where(mask[:, None], scores, -1e9)
        weights = ops.softmax(scores, axis=-1)
        if mask is not None:
            weights = weights * ops.cast(mask[:, None], weights.dtype)
        weights = ops.cast(weights, self.compute_dtype)
        dropped_weights = self.attention_dropout(weights, training=training)
        attended = ops.einsum(f"bnts,{keys}->btnh", dropped_weights, value)
        return attended, weights

    def _compute_attention_mask(
        self,
        query_length,
        value_length,
        query_mask,
        value_mask,
        key_mask,
        attention_mask,
        use_causal_mask,
        cache_update_index,
    ):
        """Merges every mask into one boolean `[B or 1, T, S]`, or None."""
        mask = None

        def merge(new):
            return new if mask is None else ops.logical_and(mask, new)

        if query_mask is not None:
            self._check_mask_shape("query_mask", query_mask, (query_length,))
            mask = merge(ops.cast(query_mask, "bool")[:, :, None])
        for name, padding_mask in (
            ("value_mask", value_mask),
            ("key_mask", key_mask),
        ):
            if padding_mask is not None:
                self._check_mask_shape(name, padding_mask, (value_length,))
                mask = merge(ops.cast(padding_mask, "bool")[:, None, :])
        # Query t is at absolute position offset + t; key s at position s.
        if use_causal_mask or self.window is not None:
            offset = 0 if cache_update_index is None else cache_update_index
            query_positions = ops.arange(query_length) + offset
            key_positions = ops.arange(value_length)
        if use_causal_mask:
            # Query t sees keys s <= t.
            causal = ops.less_equal(
                key_positions[None, :], query_positions[:, None]
            )
            mask = merge(causal[None])
        if self.window is not None:
            # Restricted attention: keys s with |t - s| <= r.
            distance = ops.abs(key_positions[None, :] - query_positions[:, None])
            mask = merge(ops.less_equal(distance, self.window)[None])
        if attention_mask is not None:
            self._check_mask_shape(
                "attention_mask", attention_mask, (query_length, value_length)
            )
            mask = merge(ops.cast(attention_mask, "bool"))
        return mask

    @staticmethod
    def _check_mask_shape(name, mask, expected_tail):
        shape = tuple(mask.shape)
        expected = ("batch",) + tuple(expected_tail)
        wrong_rank = len(shape) != len(expected)
        wrong_size = not wrong_rank and any(
            isinstance(got, int) and isinstance(want, int) and got != want
            for got, want in zip(shape[1:], expected_tail)
        )
        if wrong_rank or wrong_size:
            raise ValueError(
                f"`{name}` must have shape {expected}. Received: "
                f"{name}.shape={shape}"
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "seed": self.seed,
                "window": self.window,
            }
        )
        return config
