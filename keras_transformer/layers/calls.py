"""Direct calls of our layers in torch's decoding calls."""

import functools
import inspect

from keras_transformer.layers import initial_values


class DirectCalls:
    """A layer that takes a `decoding` argument (a
    `backend.options.DecodingOptions`, or None) and, built and called with
    options whose `direct` is set (torch's decoding calls), runs its `call`
    (its `quantized_call` if quantized) without `Layer.__call__`.

    Under torch nothing compiles a decoding step, and `Layer.__call__`'s
    argument binding, mask walk, `training` resolution and scopes cost more
    than a small model's arithmetic: on a GPU the step waits on them. Our
    layers need none of it: they pass `training`, their masks and
    `decoding` to their sublayers explicitly, and the model's own call
    opens the dtype policy's autocast for all of them. `decoding` reaches
    `call` where `call` takes it. Everywhere else the call is Keras's.

    Its weights are made through `initial_values`, where a converter gives
    their values.
    """

    def add_weight(self, *args, **kwargs):
        # Inside `initial_values`, a converted model's weight is made from its value.
        name = kwargs.get("name")
        kwargs["initializer"] = self._laid_out(name, initial_values.initializer(self, name, kwargs.get("initializer")))
        return super().add_weight(*args, **kwargs)

    def _laid_out(self, name, initializer):
        """The initializer of the weight `name`, giving its values in the
        order in memory the layer keeps them in (as given here)."""
        return initializer

    def __call__(self, *args, decoding=None, **kwargs):
        if decoding is None:  # Keras's training, inference and functional calls
            return super().__call__(*args, **kwargs)
        accepted = _call_arguments(type(self))
        if accepted is None or "decoding" in accepted:
            kwargs["decoding"] = decoding
        if decoding.direct and self.built:
            # Keras's Functional passes `training` and `mask` to every layer,
            # and `Layer.__call__` drops what `call` does not take.
            if accepted is not None and not kwargs.keys() <= accepted:
                kwargs = {name: value for name, value in kwargs.items() if name in accepted}
            if self.quantization_mode is not None:
                return self.quantized_call(*args, **kwargs)
            return self.call(*args, **kwargs)
        return super().__call__(*args, **kwargs)


@functools.cache
def _call_arguments(layer_class):
    """The names `layer_class.call` takes, or None if it takes any."""
    parameters = inspect.signature(layer_class.call).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return frozenset(parameters)
