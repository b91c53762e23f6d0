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
