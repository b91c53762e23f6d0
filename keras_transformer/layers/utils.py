"""Small helpers shared by the layers."""

import keras


def clone_initializer(initializer):
    """A fresh copy of `initializer`, so that sublayers do not share one.

    A seeded initializer object reused across sublayers would give W^Q, W^K
    and W^V the same values.
    """
    return keras.initializers.get(keras.initializers.serialize(initializer))


def sublayer_connection(inputs, sublayer, norm, dropout, normalize_first, training):
    """The residual connection around one sub-layer (sections 3.1 and 5.4).

    Post-LN, the paper's form:  LayerNorm(x + Dropout(Sublayer(x))).
    Pre-LN, the option:         x + Dropout(Sublayer(LayerNorm(x))).
    """
    if normalize_first:
        return inputs + dropout(sublayer(norm(inputs)), training=training)
    return norm(inputs + dropout(sublayer(inputs), training=training))
