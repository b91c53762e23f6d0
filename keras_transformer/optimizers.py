"""The optimizer of section 5.3: Adam with the paper's settings and
learning-rate schedule.

Keras's Adam computes the same update on every backend,

    m <- beta_1 m + (1 - beta_1) g
    v <- beta_2 v + (1 - beta_2) g^2
    w <- w - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + eps)

and ours is Keras's, except that under torch it hands the update of all
variables to torch's public fused Adam (`torch.optim.adam.adam(...,
fused=True)`), with epsilon placed where Keras places it: one kernel per
device and dtype that reads and writes each weight and its moments once,
where Keras's torch Adam makes a dozen `_foreach` passes over them. A model
trains the same under each backend (tests/test_schedule.py).
"""

import math
import operator

import keras

from keras_transformer.backend import keras_private
from keras_transformer.schedules import TransformerSchedule


def transformer_adam(d_model, warmup_steps=4000, learning_rate_scale=1.0, accumulate=1, **kwargs):
    """Adam with beta1=0.9, beta2=0.98, epsilon=1e-9 and the paper's schedule.

    Args:
        d_model: the model size, which scales the schedule.
        warmup_steps: the schedule's warmup, 4000 in the paper.
        learning_rate_scale: the schedule's constant factor, 1 in the paper.
        accumulate: batches per update (Keras's
            `gradient_accumulation_steps`, which averages their gradients;
            the schedule counts updates).
        **kwargs: other `keras.optimizers.Adam` arguments, such as
            `global_clipnorm`, or in place of the paper's (`epsilon`).

    Returns:
        An `Adam` (a `keras.optimizers.Adam`) whose learning rate is a
        `TransformerSchedule`.
    """
    if accumulate != 1:
        kwargs["gradient_accumulation_steps"] = accumulate
    settings = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9} | kwargs
    return Adam(
        learning_rate=TransformerSchedule(d_model, warmup_steps, learning_rate_scale, steps_per_update=accumulate),
        **settings,
    )


@keras.saving.register_keras_serializable(package="keras_transformer", name="Adam")
class Adam(keras_private.UpdateGradients, keras_private.ReplicaAccumulation, keras.optimizers.Adam):
    """Keras's Adam, whose update under torch runs in torch's fused kernel.

    The fused update applies where Keras's `apply` would only update:
    variables of one float dtype on one device, each with a gradient, none
    overwritten by its gradient or constrained, and no loss scale, clipping,
    weight decay, amsgrad, accumulation or moving average, outside
    `torch.compile`. Elsewhere, and on the other backends, the update is
    Keras's own.

    With `record_gradient_norm=True` it keeps the global L2 norm of the
    gradient of its last update, before clipping (with accumulation, of the
    update's averaged gradient), in `gradient_norm`, which a `Transformer`
    adds to each step's logs. Under `MirroredStrategy` it is the mean of
    the replicas' norms. The variable is left out of saved files, which
    stay those of Keras's Adam.
    """

    def __init__(self, *args, record_gradient_norm=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.record_gradient_norm = record_gradient_norm

    def get_config(self):
        return super().get_config() | {"record_gradient_norm": self.record_gradient_norm}

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self.gradient_norm = self.add_variable((), initializer="zeros", dtype="float32", aggregation="mean",
                                               name="gradient_norm")
        if self.record_gradient_norm:
            keras_private.hooks_update_gradients()

    def record_update_gradients(self, grads):
        if self.record_gradient_norm:
            self.gradient_norm.assign(global_norm(grads))

    def _saved_variables(self):
        return [v for v in self.variables if v is not getattr(self, "gradient_norm", None)]

    def save_own_variables(self, store):
        for i, variable in enumerate(self._saved_variables()):
            store[str(i)] = keras.ops.convert_to_numpy(variable)

    def load_own_variables(self, store):
        saved = self._saved_variables()
        if len(store.keys()) != len(saved):
            # As Keras's optimizers do: a state of another shape is not loaded.
            import warnings

            warnings.warn(
                f"Skipping variable loading for optimizer '{self.name}', because it has {len(saved)} "
                f"variables whereas the saved optimizer has {len(store.keys())} variables.",
                stacklevel=2,
            )
            return
        for i, variable in enumerate(saved):
            variable.assign(store[str(i)])

    def add_optimizer_variables(self, trainable_variables, name, initializer="zeros"):
        made = super().add_optimizer_variables(trainable_variables, name, initializer)
        if name == ["momentum", "velocity"]:
            # Keras's Adam makes its moments here (`build`): keep each
            # variable's for the fused update, out of Keras's tracking.
            self._fused = _FusedLists(trainable_variables, *made)
        elif name == "average":  # Keras's moving averages of the weights (`use_ema`)
            self._averages = _Untracked(made)
        return made

    def moving_averages(self):
        """The exponential moving averages of the trainable variables, in
        their order (`use_ema`); None without them."""
        held = getattr(self, "_averages", None)
        return None if held is None else list(held.items)

    def apply(self, grads, trainable_variables=None):
        lists = self._fusable(grads, trainable_variables)
        if lists is None:
            return super().apply(grads, trainable_variables)
        self.record_update_gradients(grads)
        _fused_update(self, lists, grads)
        self.iterations.assign_add(1)

    def _fusable(self, grads, variables):
        """The tensors of the fused update of `variables`, or None where
        Keras's `apply` must run (the class docstring says where)."""
        if (
            keras.backend.backend() != "torch"
            or _compiling()  # inside `torch.compile`, Keras's update is traced whole
            or variables is None
            or not self.built
            or not grads
            or any(g is None for g in grads)
            or self.loss_scale_factor is not None
            or self.clipnorm or self.clipvalue or self.global_clipnorm
            or self.weight_decay
            or self.amsgrad
            or self.gradient_accumulation_steps
            or self.use_ema
        ):
            return None
        return self._fused.lists(variables)


class _Untracked:
    """Variables held out of Keras's tracking, which would count them twice."""

    def __init__(self, items):
        self.items = tuple(items)


class _FusedLists:
    """Each variable's moments, by identity, and the fused update's lists
    per list of variables. A plain object: Keras's optimizer tracks the
    variables it finds in its lists and dicts, and would hold these twice."""

    def __init__(self, variables, momentums, velocities):
        self.moments = {
            id(variable): (variable, m, v)
            for variable, m, v in zip(variables, momentums, velocities)
            if m is not None
        }
        self.found = {}

    def lists(self, variables):
        key = tuple(map(id, variables))
        found = self.found.get(key)
        # Ids are reused once a variable is freed: the variables must be these.
        if found is None or not all(map(operator.is_, found[0], variables)):
            found = self.found[key] = (tuple(variables), _fused_lists(self.moments, variables))
        return found[1]


def _fused_lists(moments, variables):
    """`(weights, momentums, velocities, steps, step_views)` of `variables`
    for torch's fused kernel, or None where it does not apply."""
    import torch

    found = [moments.get(id(variable)) for variable in variables]
    if any(f is None or f[0] is not v for f, v in zip(found, variables)):
        return None  # a variable Keras's `apply` must see (unknown, overwritten)
    if any(v.constraint is not None or v.overwrite_with_gradient for v in variables):
        return None
    weights = [v.value for v in variables]
    if len({(w.dtype, w.device) for w in weights}) != 1 or not weights[0].is_floating_point():
        return None
    steps = torch.zeros(len(weights), dtype=torch.float32, device=weights[0].device)
    return (
        weights,
        [m.value for _, m, _ in found],
        [v.value for _, _, v in found],
        steps,
        list(steps.unbind()),
    )


def global_norm(grads):
    """The L2 norm of all of `grads` together, in float32."""
    if keras.backend.backend() == "torch" and not _compiling():
        import torch

        # One pass of torch's own over the list, not two operations a tensor.
        return torch.nn.utils.get_total_norm([g for g in grads if g is not None]).float()
    squares = [keras.ops.sum(keras.ops.square(keras.ops.cast(g, "float32"))) for g in grads if g is not None]
    return keras.ops.sqrt(keras.ops.sum(keras.ops.stack(squares)))


def _compiling():
    import torch

    return torch.compiler.is_compiling()


def _fused_update(optimizer, lists, grads):
    """Keras's Adam update at step `optimizer.iterations + 1`, by
    `torch.optim.adam.adam(..., fused=True)`."""
    from torch.optim.adam import adam

    weights, momentums, velocities, steps, step_views = lists
    t = int(optimizer.iterations.value) + 1
    # torch adds epsilon to sqrt(v) / sqrt(1 - beta_2^t), Keras to sqrt(v):
    # the same update with torch's epsilon = Keras's / sqrt(1 - beta_2^t).
    epsilon = optimizer.epsilon / math.sqrt(1.0 - optimizer.beta_2**t)
    steps.fill_(t - 1)  # torch's kernel counts each step itself, then updates
    adam(
        weights,
        # The kernel walks a gradient in its weight's memory order, and
        # autograd gives a kernel used transposed a transposed view.
        [g.contiguous() for g in grads],
        momentums,
        velocities,
        [],
        step_views,
        fused=True,
        amsgrad=False,
        beta1=optimizer.beta_1,
        beta2=optimizer.beta_2,
        lr=optimizer.learning_rate,
        weight_decay=0.0,
        eps=epsilon,
        maximize=False,
    )
