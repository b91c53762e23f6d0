"""Tensors a published checkpoint may lack, converted as transformers loads
them: each name of a group of tied matrices (embeddings shared by the
encoder, the decoder and the output layer) may be the group's only name in
the file. For each family in transformers' layout, every such name alone
must give our converter the weights the whole file gives, and transformers
the model the whole file gives. (A missing `final_logits_bias` is
test_convert_marian.py's, on every backend. FSMT ties nothing; the
fairseq checkpoint whose output layer is its decoder's embedding is
test_convert_fsmt.py's.)"""

import numpy as np
import pytest
from conftest import in_one_pass

torch = pytest.importorskip("torch")

from m2m100_fixtures import m2m100_directory  # noqa: E402
from published_fixtures import marian_directory  # noqa: E402

from keras_transformer.convert import convert  # noqa: E402

pytestmark = in_one_pass("torch", "the converters' reading of files: NumPy, the same under every backend")

FAMILIES = {
    "marian": lambda directory: marian_directory(directory, layers=1)[0],
    "marian-separate": lambda directory: marian_directory(directory, layers=1, separate=True)[0],
    "m2m100": lambda directory: m2m100_directory(directory, "m2m100")[0],
    "nllb": lambda directory: m2m100_directory(directory, "nllb")[0],
}


def tied_groups(model):
    """The names of the model's state that share one tensor, by group."""
    groups = {}
    for name, tensor in model.state_dict(keep_vars=False).items():
        groups.setdefault((tensor.data_ptr(), tuple(tensor.shape)), []).append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


def save_state(model, directory, leave_out):
    from safetensors.numpy import save_file

    state = {name: tensor.detach().numpy().copy() for name, tensor in model.state_dict().items()
             if name not in leave_out}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def logits(model):
    ids = torch.tensor([[5, 9, 14, 7, 2]])
    with torch.no_grad():
        return model(input_ids=ids, decoder_input_ids=ids, use_cache=False).logits.numpy()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_tied_name_alone_converts_as_the_whole_file_does(family, tmp_path):
    model = FAMILIES[family](tmp_path / "published").eval()
    groups = tied_groups(model)
    assert groups, "the premise: the family ties some of its matrices"
    languages = {"source_language": "en", "target_language": "de"} if family == "m2m100" else (
        {"source_language": "eng_Latn", "target_language": "deu_Latn"} if family == "nllb" else {})
    save_state(model, tmp_path / "published", leave_out=())  # every name of every group
    whole = convert(tmp_path / "published", tmp_path / "whole", **languages).model.get_weights()
    expected = logits(model)
    tried = 0
    for group in groups:
        for kept in group:
            save_state(model, tmp_path / "published", leave_out=set(group) - {kept})
            loaded = type(model).from_pretrained(tmp_path / "published").eval()
            np.testing.assert_allclose(logits(loaded), expected, rtol=0, atol=1e-6, err_msg=f"{kept} alone")
            output = tmp_path / f"alone-{tried}"
            for got, want in zip(convert(tmp_path / "published", output, **languages).model.get_weights(), whole,
                                 strict=True):
                np.testing.assert_array_equal(got, want, err_msg=f"{kept} alone")
            tried += 1
    assert tried >= 2
