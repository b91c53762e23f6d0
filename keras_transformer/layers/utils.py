"""Small helpers shared by the layers."""

import keras


def clone_initializer(initializer):
    """A fresh copy of `initializer`, so that sublayers do not share one.

    A seeded initializer object reused across sublayers would give W^Q, W^K
    and W^V the same values. (Keras's `clone`, not a round trip through
    its serialization, which imports TensorFlow wherever it is installed.)
    """
    return keras.initializers.get(initializer).clone()


def sublayer_connection(inputs, sublayer, norm, dropout, normalize_first, training, decoding=None):
    """The residual connection around one sub-layer (sections 3.1 and 5.4).

    Post-LN, the paper's form:  LayerNorm(x + Dropout(Sublayer(x))).
    Pre-LN, the option:         x + Dropout(Sublayer(LayerNorm(x))).

    `sublayer(x)` is called as it is; `norm` and `dropout` get `decoding`.
    """
    if normalize_first:
        return inputs + dropout(sublayer(norm(inputs, decoding=decoding)), training=training, decoding=decoding)
    return norm(inputs + dropout(sublayer(inputs), training=training, decoding=decoding), decoding=decoding)


def sublayers(layer):
    """`layer` and every layer it holds, at any depth, each once: the layers
    held in its attributes, directly or in lists, tuples and dicts, as Keras
    tracks them."""
    found, stack, seen = [], [layer], set()
    while stack:
        item = stack.pop()
        if isinstance(item, keras.layers.Layer):
            if id(item) in seen:
                continue
            seen.add(id(item))
            found.append(item)
            stack.extend(reversed(list(vars(item).values())))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found
