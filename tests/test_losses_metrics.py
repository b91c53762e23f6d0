import keras
import numpy as np
import pytest

from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import MaskedTokenAccuracy
from keras_transformer.metrics import Perplexity
from keras_transformer.metrics import TargetTokens

from conftest import to_numpy

V = 7


@pytest.fixture
def labels_and_logits(rng):
    labels = np.array([[3, 4, 2, 0, 0], [5, 6, 1, 2, 0]], "int32")
    logits = rng.normal(size=(2, 5, V)).astype("float32")
    return labels, logits


def reference_loss(labels, logits, eps):
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    smoothed = np.full(logits.shape, eps / V)
    smoothed += (1 - eps) * np.eye(V)[labels]
    per_token = -(smoothed * log_probs).sum(-1)
    real = labels != 0
    return per_token[real].mean()


@pytest.mark.parametrize("eps", [0.1, 0.0, 0.3])
def test_label_smoothed_loss_matches_the_formula(labels_and_logits, eps):
    labels, logits = labels_and_logits
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)(labels, logits)
    assert float(to_numpy(loss)) == pytest.approx(reference_loss(labels, logits, eps), rel=1e-5)


def test_without_smoothing_it_is_sparse_cross_entropy_on_real_tokens(labels_and_logits):
    labels, logits = labels_and_logits
    real = labels != 0
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
        labels[real], logits[real]
    )
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.0)(labels, logits)
    assert float(to_numpy(loss)) == pytest.approx(float(to_numpy(expected)), rel=1e-5)


def test_loss_and_metrics_ignore_padding(labels_and_logits, rng):
    labels, logits = labels_and_logits
    changed = logits.copy()
    changed[labels == 0] = 50.0 * rng.normal(size=changed[labels == 0].shape)
    for make in (LabelSmoothedCrossEntropy, MaskedTokenAccuracy, Perplexity):
        values = []
        for candidate in (logits, changed):
            measure = make()
            if isinstance(measure, keras.losses.Loss):
                values.append(float(to_numpy(measure(labels, candidate))))
            else:
                measure.update_state(labels, candidate)
                values.append(float(to_numpy(measure.result())))
        assert values[0] == pytest.approx(values[1], rel=1e-6), make.__name__


def test_smoothing_prefers_a_less_confident_model():
    """eps_ls > 0 penalizes putting all mass on the label."""
    labels = np.array([[3]])
    confident = np.full((1, 1, V), -30.0, "float32")
    confident[0, 0, 3] = 30.0
    hedged = np.zeros((1, 1, V), "float32")
    hedged[0, 0, 3] = 4.0
    smoothed = LabelSmoothedCrossEntropy(0.1)
    plain = LabelSmoothedCrossEntropy(0.0)
    assert to_numpy(smoothed(labels, hedged)) < to_numpy(smoothed(labels, confident))
    assert to_numpy(plain(labels, confident)) < to_numpy(plain(labels, hedged))


def test_masked_token_accuracy_accumulates_over_batches(labels_and_logits):
    labels, logits = labels_and_logits
    predictions = logits.argmax(-1)
    real = labels != 0
    metric = MaskedTokenAccuracy()
    metric.update_state(labels[:1], logits[:1])
    metric.update_state(labels[1:], logits[1:])
    expected = (predictions == labels)[real].mean()
    assert float(to_numpy(metric.result())) == pytest.approx(expected)
    one_hot = np.eye(V, dtype="float32")[labels] * 10
    metric.reset_state()
    metric.update_state(labels, one_hot)
    assert float(to_numpy(metric.result())) == 1.0


def test_perplexity_is_exp_of_mean_negative_log_likelihood(labels_and_logits):
    labels, logits = labels_and_logits
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    metric = Perplexity()
    metric.update_state(labels, logits)
    assert float(to_numpy(metric.result())) == pytest.approx(
        np.exp(nll[labels != 0].mean()), rel=1e-5
    )


def test_target_tokens_counts_the_non_padding_labels_until_reset(labels_and_logits):
    labels, logits = labels_and_logits
    metric = TargetTokens()
    metric.update_state(labels[:1], logits[:1])
    metric.update_state(labels[1:], logits[1:])
    assert float(to_numpy(metric.result())) == int((labels != 0).sum())
    metric.reset_state()
    metric.update_state(labels[:1], logits[:1])
    assert float(to_numpy(metric.result())) == int((labels[:1] != 0).sum())


def test_config_round_trips():
    for obj in (LabelSmoothedCrossEntropy(0.2, padding_id=5), MaskedTokenAccuracy(padding_id=5), Perplexity(padding_id=5), TargetTokens(padding_id=5)):
        clone = type(obj).from_config(obj.get_config())
        assert clone.get_config() == obj.get_config()
    with pytest.raises(ValueError, match="label_smoothing=1.5"):
        LabelSmoothedCrossEntropy(1.5)


def loss_gradient(labels, logits, eps):
    """d loss / d logits, through the backend's own differentiation."""
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda z: loss(labels, z))(logits))
    if backend == "torch":
        import torch

        z = torch.tensor(logits, requires_grad=True)
        loss(labels, z).backward()
        return z.grad.numpy()
    import tensorflow as tf

    z = tf.Variable(logits)
    with tf.GradientTape() as tape:
        value = loss(labels, z)
    return tape.gradient(value, z).numpy()


@pytest.mark.parametrize("eps", [0.1, 0.0])
def test_the_loss_gradient_is_softmax_minus_the_smoothed_target_over_real_tokens(labels_and_logits, eps):
    labels, logits = labels_and_logits
    logits = logits * 5.0  # some confident tokens too
    real = labels != 0
    softmax = np.exp(logits - logits.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    target = np.full(logits.shape, eps / V) + (1 - eps) * np.eye(V)[labels]
    expected = (softmax - target) * real[..., None] / real.sum()
    np.testing.assert_allclose(loss_gradient(labels, logits, eps), expected, rtol=1e-4, atol=1e-6)


def test_the_loss_and_its_gradient_stay_finite_at_extreme_logits():
    labels = np.array([[1, 2]], "int32")
    logits = np.array([[[1e4, -1e4, 0.0], [-1e4, 1e4, 3e4]]], "float32")
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    value = float(to_numpy(loss(labels, logits)))
    gradient = loss_gradient(labels, logits, 0.1)
    assert np.isfinite(value) and value > 1e3  # both labels far below the best logit
    assert np.all(np.isfinite(gradient))
    np.testing.assert_allclose(gradient.sum(-1), 0.0, atol=1e-6)  # softmax and target both sum to 1


def test_accuracy_counts_a_label_tied_for_the_largest_logit_as_right():
    labels = np.array([[1, 2, 1]], "int32")
    logits = np.array([[[0.0, 2.0, 2.0], [0.0, 2.0, 2.0], [3.0, 2.0, 2.0]]], "float32")
    # As arrays, and as the backend's tensors (a torch step's: one gather).
    for convert in (np.asarray, keras.ops.convert_to_tensor):
        metric = MaskedTokenAccuracy()
        metric.update_state(convert(labels), convert(logits))
        assert float(to_numpy(metric.result())) == pytest.approx(2 / 3)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="looks at XLA's program of the step; the gradient tests above cover every backend")
def test_under_jax_a_training_step_passes_over_the_logits_few_times():
    """The loss's gradient is written out (backend/cross_entropy.py) and the
    metrics share the loss's reductions: in the compiled step of loss,
    gradient, accuracy and perplexity, one XLA kernel writes a tensor the
    size of the logits, the gradient (six did when autodiff differentiated
    `log_softmax` and a `where`)."""
    import jax

    from keras_transformer.metrics import Perplexity

    batch, length, vocabulary = 6, 5, 997  # a size no other tensor has
    rng = np.random.default_rng(0)
    labels = rng.integers(0, vocabulary, size=(batch, length)).astype("int32")
    loss = LabelSmoothedCrossEntropy(0.1)

    def step(logits):
        value, gradient = jax.value_and_grad(lambda z: loss(labels, z))(logits)
        metrics = [
            metric.stateless_update_state([v.value for v in metric.variables], labels, logits)
            for metric in (MaskedTokenAccuracy(), Perplexity())
        ]
        return value, gradient, metrics

    logits = rng.normal(size=(batch, length, vocabulary)).astype("float32")
    hlo = jax.jit(step).lower(logits).compile().as_text()
    kernels = [line.split("=", 1) for line in hlo.splitlines() if "fusion(" in line or "custom-call(" in line]
    writing_logits = [name for name, rest in kernels if f",{vocabulary}]" in rest.split("(", 1)[0]]
    assert len(writing_logits) == 1, writing_logits


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="counts the eager torch operations of a step; the gradient tests above cover every backend")
def test_under_torch_a_training_step_passes_over_the_logits_few_times():
    """Under torch every operation is a kernel of its own. The loss's
    gradient is written out: the logits' size is written by the output
    product, the loss's `log_softmax`, the perplexity metric's, and the
    gradient's `exp`, scatter and multiply-add (autodiff of the formula
    made twice as many passes). The step's loss and perplexity are still
    the formula's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import keras_transformer as kt
    from keras_transformer.training import compile_model

    vocabulary, shape = 997, (6, 5)  # a size no other tensor has
    no_writes = ("view", "expand", "detach", "permute", "t.default", "transpose", "unsqueeze", "squeeze", "_unsafe_view")

    class LogitsWrites(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.operations = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            output = func(*args, **(kwargs or {}))
            for tensor in keras.tree.flatten(output):
                if getattr(tensor, "shape", ())[-1:] == (vocabulary,) and not any(word in str(func) for word in no_writes):
                    self.operations.append(str(func))
            return output

    model = kt.build_transformer(vocabulary_size=vocabulary, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.0)
    compile_model(model, label_smoothing=0.1)
    rng = np.random.default_rng(0)
    x = {name: rng.integers(1, vocabulary, shape).astype("int32") for name in ("source_ids", "target_ids")}
    labels = rng.integers(1, vocabulary, shape).astype("int32")
    labels[:, -1] = 0  # padding
    model.train_on_batch(x, labels)  # builds the optimizer
    logits = to_numpy(model(x)).astype("float64")
    with LogitsWrites() as writes:
        logs = model.train_on_batch(x, labels, return_dict=True)
    assert writes.operations.count("aten._log_softmax.default") == 2, writes.operations
    assert len(writes.operations) <= 6, writes.operations

    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    real = labels != 0
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(logs["perplexity"], np.exp(nll[real].mean()), rtol=1e-4)
    smoothed = 0.9 * nll - 0.1 * log_probs.mean(-1)
    np.testing.assert_allclose(logs["loss"], smoothed[real].mean(), rtol=1e-4)
