import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_report_header(config):
    return f"keras backend: {keras.backend.backend()}, keras {keras.__version__}"


@pytest.fixture(autouse=True)
def seeded():
    keras.utils.set_random_seed(1234)
    yield


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def random_ids(rng, shape, vocabulary_size, low=3):
    return rng.integers(low, vocabulary_size, size=shape).astype("int32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
