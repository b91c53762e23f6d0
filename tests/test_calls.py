"""Our layers' direct calls in torch's train, test and predict steps
(keras_transformer/layers/calls.py, backend/state.py's `direct_steps`)."""

import contextlib
import types

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.backend import state
from keras_transformer.layers import calls

V = 40


def batch():
    rng = np.random.default_rng(0)
    source = rng.integers(3, V, (4, 7)).astype("int32")
    target = rng.integers(3, V, (4, 6)).astype("int32")
    source[1, 4:] = 0  # padding, which the masks must keep out
    target[2, 3:] = 0
    return {"source_ids": source, "target_ids": target}, target


def trained(dtype, direct, monkeypatch, dropout=0.3, regularizer=None):
    """Weights, logs (loss and metrics) and predictions after 3 train steps
    of a tiny model, with our layers' direct calls in its steps or through
    `Layer.__call__`; `regularizer` on its first weight."""
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(state, "direct_steps", lambda compiled=False: contextlib.nullcontext())
        keras.utils.set_random_seed(3)
        model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1, dropout=dropout, attention_dropout=0.1, dtype=dtype)
        training.compile_model(model, warmup_steps=2)
        model.trainable_weights[0].regularizer = regularizer
        x, y = batch()
        calls._call_arguments.cache_clear()
        losses = [model.train_on_batch(x, y, return_dict=True) for _ in range(3)]
        predictions = model.predict_on_batch(x)
        direct_calls = calls._call_arguments.cache_info().hits + calls._call_arguments.cache_info().misses
    return model.get_weights(), losses, predictions, direct_calls


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="direct calls in steps are torch's; TensorFlow and JAX trace a step once, through Keras's calls",
)
@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_a_step_of_direct_calls_trains_as_keras_s_calls_do(dtype, monkeypatch):
    """Under torch, our layers run their `call` directly in each step: the
    same weights, losses and predictions, bit for bit, as through
    `Layer.__call__`, dropout streams and bfloat16 casts included."""
    weights, losses, predictions, direct_calls = trained(dtype, True, monkeypatch)
    keras_weights, keras_losses, keras_predictions, keras_direct_calls = trained(dtype, False, monkeypatch)
    assert direct_calls > 0 and keras_direct_calls == 0
    assert losses == keras_losses
    np.testing.assert_array_equal(predictions, keras_predictions)
    for got, want in zip(weights, keras_weights):
        np.testing.assert_array_equal(got, want)
    assert {"loss", "masked_token_accuracy", "perplexity"} <= losses[0].keys()  # the metrics compared too
    # Dropout acted in those steps: without it the weights differ.
    plain_weights = trained(dtype, True, monkeypatch, dropout=0.0)[0]
    assert any(not np.array_equal(a, b) for a, b in zip(plain_weights, weights))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the step that takes the compiled loss alone is torch's; TensorFlow and JAX run Keras's step")
def test_a_regularizer_adds_to_a_direct_step_s_loss_as_to_keras_s(monkeypatch):
    """A torch step takes the compiled loss alone only where nothing adds to
    it: a weight's regularizer still adds its penalty, as in Keras's step."""
    penalty = keras.regularizers.L2(0.5)
    weights, logs, _, _ = trained("float32", True, monkeypatch, regularizer=penalty)
    keras_weights, keras_logs, _, _ = trained("float32", False, monkeypatch, regularizer=penalty)
    assert logs == keras_logs
    for got, want in zip(weights, keras_weights):
        np.testing.assert_array_equal(got, want)
    plain_logs = trained("float32", True, monkeypatch)[1]
    assert logs[0]["loss"] > plain_logs[0]["loss"]


def test_steps_call_our_layers_directly_only_under_torch_uncompiled():
    """Every backend: a step's context opens direct calls under torch, and
    neither under TensorFlow and JAX, whose steps are traced, nor for a
    step that torch compiles."""
    assert not state.direct()
    with state.direct_steps():
        assert state.direct() == (keras.backend.backend() == "torch")
    with state.direct_steps(compiled=True):
        assert not state.direct()
    assert not state.direct()


def test_a_direct_call_drops_the_arguments_its_call_does_not_take():
    """Keras's Functional passes `training` and `mask` to every layer; the
    direct call passes on only what `call` takes, as `Layer.__call__` does."""

    class Takes(calls.DirectCalls, keras.layers.Layer):
        def call(self, x, training=None):
            self.training = training
            return x

    class TakesAny(calls.DirectCalls, keras.layers.Layer):
        def call(self, x, **kwargs):
            self.kwargs = kwargs
            return x

    takes, takes_any = Takes(), TakesAny()
    takes.build((2,))
    takes_any.build((2,))
    x = np.ones((1, 2), "float32")
    with state.decoding_call(direct=True):
        assert takes(x, training=True, mask=None) is x and takes.training is True
        takes_any(x, training=False, mask=None)
        assert takes_any.kwargs == {"training": False, "mask": None}


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="TensorFlow and JAX trace the train step once, so Keras lists the variables once there already; only torch's step is ours")
def test_a_torch_fit_lists_its_variables_once_and_leaves_no_gradients(monkeypatch):
    """Under torch, `fit` lists the trainable variables once for all its
    steps (Keras's step walks the model's layers for them twice a step),
    and the steps take their gradients without leaving them on the weights
    for the next step to clear."""
    from keras_transformer.backend import keras_private
    from keras_transformer.backend import torch_step

    listings, walks = [], []
    listed, sublayers = torch_step.listed, keras_private.sublayers
    monkeypatch.setattr(torch_step, "listed", lambda model, variables: listings.append(1) or listed(model, variables))
    monkeypatch.setattr(keras_private, "sublayers", lambda model: walks.append(1) or sublayers(model))
    keras.utils.set_random_seed(3)
    model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1)
    training.compile_model(model, warmup_steps=2)
    before = [w.copy() for w in model.get_weights()]
    x, y = batch()
    model.fit({key: np.repeat(value, 3, axis=0) for key, value in x.items()}, np.repeat(y, 3, axis=0), batch_size=4, epochs=1, verbose=0)
    assert model.optimizer.iterations.numpy() == 3
    assert len(listings) == 1 and len(walks) == 1
    assert all(variable.value.grad is None for variable in model.trainable_weights)
    assert all(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_a_variable_read_directly_is_the_tensor_keras_s_read_gives():
    """`keras_private.torch_value`, which our direct calls read kernels,
    biases and norms' scales with, gives what `Variable.value` gives: cast
    to the dtype of a mixed-precision layer's call only for a float
    variable that autocasts, the scope's values inside a stateless scope,
    and Keras's own read under the other backends."""
    from keras_transformer.backend import keras_private

    class Reads(keras.layers.Layer):
        """Both reads of each variable, inside the layer's call."""

        def build(self, input_shape):
            self.kernel = self.add_weight(shape=(2, 3), initializer="ones")
            self.fixed = self.add_weight(shape=(3,), initializer="ones", autocast=False)
            self.counts = self.add_weight(shape=(3,), initializer="ones", dtype="int32", trainable=False)

        def call(self, inputs):
            return [(keras_private.torch_value(v), v.value) for v in (self.kernel, self.fixed, self.counts)]

    for dtype, cast in (("float32", "float32"), ("mixed_bfloat16", "bfloat16"), ("mixed_bfloat16", "bfloat16")):
        keras.backend.clear_session()  # which replaces Keras's record of the open scopes
        layer = Reads(dtype=dtype)
        layer.build(None)
        layer.kernel.assign(np.arange(6.0).reshape(2, 3))
        reads = layer(np.zeros((1,)))
        with keras.StatelessScope(state_mapping=[(layer.kernel, keras.ops.full((2, 3), 7.0))]):
            stateless = layer(np.zeros((1,)))
        for ours, keras_s in reads + stateless:
            assert keras.backend.standardize_dtype(ours.dtype) == keras.backend.standardize_dtype(keras_s.dtype)
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(keras_s))
        assert [keras.backend.standardize_dtype(ours.dtype) for ours, _ in reads] == [cast, "float32", "int32"]
        assert keras.ops.convert_to_numpy(stateless[0][0])[0, 0] == 7.0
        if keras.backend.backend() == "torch" and dtype == "float32":
            assert reads[0][0] is layer.kernel.value  # the parameter itself, which gradients reach


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="only torch's eager step casts weights one operation at a time; TensorFlow and JAX compile the step, and XLA fuses each cast into its product")
def test_a_mixed_precision_torch_step_casts_its_weights_all_at_once(monkeypatch):
    """A mixed_bfloat16 torch step casts its float32 weights to bfloat16
    with one operation, and their gradients back with another, where
    Keras's reads cast each weight, and autograd each gradient, one
    operation at a time."""
    import torch

    from conftest import torch_operations
    from keras_transformer.backend import keras_private
    from keras_transformer.backend import step_casts

    def casts(all_at_once):
        keras.utils.set_random_seed(3)
        model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=1, dtype="mixed_bfloat16")
        training.compile_model(model, warmup_steps=2)
        x, y = batch()
        with monkeypatch.context() as patch:
            if not all_at_once:
                patch.setattr(step_casts, "step_casts", lambda *args: None)
            model.train_on_batch(x, y)  # builds the optimizer
            with torch_operations() as step:
                model.train_on_batch(x, y)
        names = [operation.__name__ for operation in step.operations]
        return names.count("_to_copy.default"), names.count("_foreach_copy_.default"), model

    one_by_one, no_foreach, _ = casts(False)
    all_at_once, foreach, model = casts(True)
    copied = [
        variable
        for variable in model.trainable_weights
        if keras_private.autocasts(variable) and variable.value.dtype == torch.float32
    ]
    assert len(copied) > 10 and no_foreach == 0 and foreach == 2
    # Each copied weight is read once a step: a cast forward, one backward.
    assert one_by_one - all_at_once == 2 * len(copied), (one_by_one, all_at_once, len(copied))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the weights' copies exist only in torch's eager step; TensorFlow and JAX compile the step, and XLA fuses each cast into its product")
def test_a_weight_read_both_as_a_copy_and_by_keras_gets_both_gradients():
    """A step's layers read a weight's compute-dtype copy through
    `keras_private.torch_value`; a read through Keras's own property still
    casts the float32 weight. The gradient the optimizer gets is the sum
    of both reads', in float32; a read after the step is a cast again."""
    import torch

    from keras_transformer.backend import keras_private
    from keras_transformer.backend import step_casts

    layer = keras.layers.Dense(3, dtype="mixed_bfloat16")
    layer.build((None, 2))
    kernel = layer.kernel
    parameter = kernel.value
    casts = step_casts.StepCasts([kernel, layer.bias], [parameter, layer.bias.value], "bfloat16")
    assert casts.indices == [0, 1]
    kernel.assign(np.full((2, 3), 1.5))  # the copies are filled when a step reads
    with casts.reading(), keras_private.outermost_autocast(layer):
        ours = keras_private.torch_value(kernel)
        keras_s = kernel.value
        assert ours is casts.copies[0] and keras_s is not ours
        assert ours.dtype == keras_s.dtype == torch.bfloat16
        np.testing.assert_array_equal(ours.detach().float().numpy(), np.full((2, 3), 1.5))
        loss = 2.0 * ours.float().sum() + 3.0 * keras_s.float().sum()
    gradients = casts.gradients(loss, [parameter, layer.bias.value])
    assert gradients[0].dtype == torch.float32
    np.testing.assert_array_equal(gradients[0].numpy(), np.full((2, 3), 5.0))
    assert gradients[1] is None  # the unread bias
    with keras_private.outermost_autocast(layer):
        assert keras_private.torch_value(kernel) is not casts.copies[0]


def a_step_s_operations(monkeypatch, replaced=None):
    """The names of the torch operations of a train step of a tiny model of
    3 + 3 blocks (after a first step, which builds it), with `replaced`
    `(module, name, value)` set for both steps; and its weights after."""
    from conftest import torch_operations

    keras.utils.set_random_seed(3)
    model = kt.build_transformer("tiny", vocabulary_size=V, num_layers=3, dropout=0.0)
    training.compile_model(model)  # warmup 4000: steps small enough that rounding stays rounding
    x, y = batch()
    with monkeypatch.context() as patch:
        if replaced is not None:
            patch.setattr(*replaced)
        first = model.train_on_batch(x, y)
        with torch_operations() as operations:
            second = model.train_on_batch(x, y)
    model.step_losses = (first, second)  # the steps' own losses, for comparing two ways of a step
    return [operation.__name__ for operation in operations.operations], model


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="only torch's step is eager; TensorFlow and JAX compile the step, and XLA adds each bias inside its product's fusion")
def test_a_torch_step_adds_each_bias_inside_its_product(monkeypatch):
    """Under torch, each projection with a bias is one `addmm` (a kernel
    fewer on a GPU, where a step is bound by the host's launches), not a
    product and an `add`: the same step, to float32 rounding."""
    from keras_transformer.backend import products

    names, model = a_step_s_operations(monkeypatch)
    apart, apart_model = a_step_s_operations(monkeypatch, (products, "biased_product", lambda *args, **kwargs: None))
    biased = [
        layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense) and layer.bias is not None
    ]
    # 3 + 3 blocks: 6 projections an encoder block, 10 a decoder block.
    assert len(biased) == 48
    assert (names.count("addmm.default"), apart.count("addmm.default")) == (48, 0)
    assert apart.count("add.Tensor") - names.count("add.Tensor") == 48
    # The loss of both steps, and the weights after: Adam's first steps at
    # warmup 4000 move a weight by about 1e-6, so its rounding stays below.
    np.testing.assert_allclose(model.step_losses, apart_model.step_losses, rtol=1e-5)
    for got, want in zip(model.get_weights(), apart_model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the memo is for torch's eager step; TensorFlow and JAX trace a step once, and the compiler merges the layers' identical mask computations")
def test_a_torch_step_derives_each_stack_s_attention_mask_once(monkeypatch):
    """In a torch train step, the attention layers of a stack get the same
    masks and derive their merged, additive and no-key masks from them once
    a step, not once a layer: the same weights after the step."""

    def step(memo):
        names, model = a_step_s_operations(monkeypatch, None if memo else (state, "step_memo", contextlib.nullcontext))
        return names.count("any.dim"), model.get_weights()

    once, weights = step(True)
    per_layer, per_layer_weights = step(False)
    # Nine attention layers, three masks (the encoder's self-attention, the
    # decoder's, the cross-attention): one `any` a derivation, 9 -> 3.
    assert per_layer - once == 9 - 3, (once, per_layer)
    for got, want in zip(weights, per_layer_weights):
        np.testing.assert_array_equal(got, want)
    assert state.memoized("kind", (1,), lambda: []) is not state.memoized("kind", (1,), lambda: [])  # no memo outside a step


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's step runs its metrics eagerly; TensorFlow and JAX trace them into the step, where the compiler merges the masks and fuses the adds")
def test_a_torch_step_s_metrics_share_one_mask_and_add_in_place(monkeypatch):
    """Our token metrics derive the non-padding mask and its sum once a
    torch step for all of them, and add to their totals in place (one
    operation each, where Keras's `assign_add` makes a sum and copies it
    in): the same results as Keras's arithmetic."""
    from keras_transformer import metrics
    from keras_transformer.backend import keras_private

    def step(replaced=None):
        names, model = a_step_s_operations(monkeypatch, replaced)
        return names, {name: float(value) for name, value in model.get_metrics_result().items()}

    names, results = step()
    unshared, unshared_results = step((metrics, "state", types.SimpleNamespace(memoized=lambda kind, inputs, make: make())))
    keras_s, keras_s_results = step((keras_private, "assign_add", lambda variable, value: variable.assign_add(value)))
    # Three metrics, each deriving the mask (`ne`) and summing it: one of each.
    assert unshared.count("ne.Tensor") - names.count("ne.Tensor") == 2
    assert unshared.count("sum.default") - names.count("sum.default") == 2
    # Five additions (two totals a metric, one for the tokens' count).
    assert names.count("add_.Tensor") - keras_s.count("add_.Tensor") == 5
    assert keras_s.count("copy_.default") - names.count("copy_.default") == 5
    assert results == unshared_results == keras_s_results
    assert set(results) >= {"masked_token_accuracy", "perplexity", "target_tokens"}
