"""The compile settings a model saves: as they were asked for, so that the
backend that loads the model resolves them for itself."""

import keras


class CompiledAsAsked:
    """`compile`, `get_compile_config` and `compile_from_config` of a
    `keras.Model` whose saved `jit_compile` is the one given to `compile`.

    Keras saves what its backend resolved `"auto"` to: True under JAX and
    TensorFlow's GPUs (XLA), False under torch. A model compiled with the
    default under JAX, saved and loaded under torch would then train
    through `torch.compile`, which nobody asked for. Saved as `"auto"`, it
    is resolved by the backend that loads it; a `True` or `False` given to
    `compile` is saved as it is.
    """

    # What `compile` was given, or None before it was called.
    _jit_compile_asked = None

    def compile(self, *args, jit_compile="auto", **kwargs):
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        self._jit_compile_asked = jit_compile

    def get_compile_config(self):
        config = super().get_compile_config()
        if config is not None and self._jit_compile_asked == "auto":
            config["jit_compile"] = "auto"
        return config

    def compile_from_config(self, config):
        # Keras's own declines a model whose `compile` is its own, as this one's is.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if getattr(self, "optimizer", None) is not None and self.built:
            self.optimizer.build(self.trainable_variables)
