"""Direct calls of our layers inside a torch decoding call."""

from keras_transformer.backend import state


class DirectCalls:
    """A layer that, built and called inside a torch decoding call
    (`backend.state.direct()`), runs its `call` (its `quantized_call` if
    quantized) without `Layer.__call__`.

    Under torch nothing compiles a search, and `Layer.__call__`'s argument
    binding, mask walk, `training` resolution and scopes cost more than a
    decoding step's arithmetic. A decoding call needs none of it: its layers
    compute in their variables' dtype, run at inference, and pass their
    masks explicitly. Everywhere else the call is Keras's.
    """

    def __call__(self, *args, **kwargs):
        if state.direct() and self.built:
            if self.quantization_mode is not None:
                return self.quantized_call(*args, **kwargs)
            return self.call(*args, **kwargs)
        return super().__call__(*args, **kwargs)
