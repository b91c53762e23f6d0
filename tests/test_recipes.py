"""The quick-start recipe runs end to end: corpus, vocabulary, training,
saving, greedy translation and sacrebleu scoring."""

import os
import subprocess
import sys

import keras
import keras_transformer as kt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quickstart_runs_end_to_end(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "recipes", "quickstart.py"),
            "--train-size", "400",
            "--valid-size", "50",
            "--test-size", "50",
            "--epochs", "1",
            "--vocabulary-size", "500",
            "--model-dir", str(tmp_path / "model"),
        ],
        env=dict(os.environ, KERAS_BACKEND=keras.backend.backend()),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Backend: {keras.backend.backend()}" in result.stdout
    assert "sacrebleu signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout
    assert "exact translations, subordinate clause (verb last)" in result.stdout
    model = keras.saving.load_model(tmp_path / "model" / "model.keras")
    tokenizer = kt.data.SubwordTokenizer.load(tmp_path / "model")
    assert model.vocabulary_size == tokenizer.vocabulary_size == 500
