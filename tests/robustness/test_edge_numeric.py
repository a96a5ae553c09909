"""NaN, inf and dimension mismatches in embeddings, codes and scores: what each room does with them.

Decided (docs/robustness.md, "Numeric and batch edge cases"):
- the dictionary (transform, encode_embeddings, centre, inverse_transform) and the editor refuse
  non-finite embeddings or codes with a `LaceInputError` naming the row;
- the losses propagate NaN (as open_clip and `F.cross_entropy` do), and the trainer stops at the
  first logged non-finite loss, before it can write a checkpoint of the diverged weights;
- nearest-neighbour search, so every geometry figure and recall@k, refuses non-finite embeddings;
- pairwise benchmark scores count an item with a NaN score as a failure (NaN never beats anything);
- every dimension mismatch is an error that names the argument and the expected shape.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lace.errors import LaceInputError
from lace.eval.diagnostics import geometry_diagnostics
from lace.eval.metrics import pairwise_accuracy, retrieval_recall, winoground_scores
from lace.losses import clip_loss, lace_loss
from lace.train import TensorPairs, train
from lace.train.config import train_config
from tests.toy_concepts import toy_editor

BAD_VALUES = (float("nan"), float("inf"), float("-inf"))


@pytest.fixture(scope="module")
def toy():
    return toy_editor(200)


def poisoned(z: torch.Tensor, value: float, row: int = 2) -> torch.Tensor:
    z = z.clone()
    z[row, 5] = value
    return z


@pytest.mark.parametrize("value", BAD_VALUES)
def test_dictionary_and_editor_refuse_non_finite_embeddings_naming_the_row(toy, value):
    dictionary, editor, images, _ = toy
    z = poisoned(images[:6], value)
    for call in (lambda: dictionary.transform(z, "image"), lambda: dictionary.encode_embeddings(z, "image"),
                 lambda: editor.counterfactuals(z, "image", 2), lambda: editor.random_control(z, "image", 2)):
        with pytest.raises(LaceInputError, match=r"row 2.*finite"):
            call()


def test_dictionary_refuses_non_finite_codes_and_codes_of_the_wrong_width(toy):
    dictionary, _, images, _ = toy
    codes = dictionary.transform(images[:4], "image", dense=True)  # (4, K)
    torch.testing.assert_close(dictionary.inverse_transform(codes, "image").norm(dim=1), torch.ones(4))
    with pytest.raises(LaceInputError, match=r"codes.*row 1.*finite"):
        dictionary.inverse_transform(poisoned(codes, float("nan"), row=1), "image")
    sparse = dictionary.transform(images[:4], "image")
    sparse.values[3, 0] = float("inf")
    with pytest.raises(LaceInputError, match=r"codes.*row 3"):
        dictionary.inverse_transform(sparse, "image")
    with pytest.raises(LaceInputError, match=rf"\(N, {codes.shape[1]}\)"):
        dictionary.inverse_transform(codes[:, :-1], "image")


def test_dimension_mismatches_name_the_expected_shape(toy):
    dictionary, editor, images, texts = toy
    with pytest.raises(LaceInputError, match=r"\(N, 32\)"):
        dictionary.transform(images[:4, :16], "image")
    with pytest.raises(LaceInputError, match=r"\(B, 32\)"):
        editor.counterfactuals(images[:4, :16], "image", 2)
    scale = torch.tensor(10.0)
    with pytest.raises(LaceInputError, match="'V'"):
        clip_loss(images[:4], texts[:4, :16], scale)
    with pytest.raises(LaceInputError, match="'V'"):
        clip_loss(images[:4], texts[:3], scale)
    with pytest.raises(LaceInputError, match="'gallery_texts'"):
        clip_loss(images[:4], texts[:4], scale, gallery_texts=texts[:8, :16])
    with pytest.raises(LaceInputError, match="'gallery_images'"):
        clip_loss(images[:4], texts[:4], scale, gallery_images=images[:8], gallery_texts=texts[:8], row_offset=6)
    with pytest.raises(LaceInputError, match="'logit_scale'"):
        clip_loss(images[:4], texts[:4], torch.ones(4))
    with pytest.raises(ValueError, match=r"negatives must have shape \(B, M, d\)"):
        lace_loss(images[:4], texts[:4], scale, texts[:4, None, :16])
    with pytest.raises(ValueError, match=r"expected \(Q, d\) and \(G, d\)"):
        geometry_diagnostics(images[:4], texts[:4, :16], [0, 1, 2, 3])


@pytest.mark.parametrize("value", BAD_VALUES)
def test_losses_propagate_non_finite_embeddings(toy, value):
    _, _, images, texts = toy
    U = poisoned(images[:6], value)
    loss = lace_loss(U, texts[:6], torch.tensor(10.0), texts[:6, None], None)
    assert not torch.isfinite(loss)  # never a finite loss made of a poisoned batch
    assert torch.isfinite(clip_loss(images[:6], texts[:6], torch.tensor(10.0)))


@pytest.mark.parametrize("value", BAD_VALUES)
def test_geometry_and_recall_refuse_non_finite_embeddings(toy, value):
    _, _, images, texts = toy
    with pytest.raises(LaceInputError, match=r"queries.*row 2.*finite"):
        geometry_diagnostics(poisoned(images[:8], value), texts[:8], list(range(8)))
    with pytest.raises(LaceInputError, match=r"gallery.*row 2.*finite"):
        retrieval_recall(images[:8], poisoned(texts[:8], value), list(range(8)))


def test_a_nan_score_never_beats_anything():
    assert pairwise_accuracy([float("nan"), 1.0, 1.0], [0.0, float("nan"), 0.0]) == pytest.approx(1 / 3)
    scores = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[float("nan"), 0.0], [0.0, 1.0]]])
    assert winoground_scores(scores) == {"text": 0.5, "image": 0.5, "group": 0.5}


def test_a_diverged_run_stops_before_writing_a_checkpoint(tmp_path):
    pixels = torch.randn(8, 3, 32, 32)
    pixels[3] = float("nan")  # one poisoned image: its embedding, the loss and then the weights go NaN
    config = train_config(model="lace-micro-32", output=str(tmp_path / "run"), steps=3, batch_size=8, lr=1e-3,
                         warmup_steps=0, log_every=1, checkpoint_every=1, device="cpu", seed=0)
    with pytest.raises(LaceInputError, match=r"loss is nan at step 1.*no checkpoint was written"):
        train(config, dataset=TensorPairs(pixels, [["a red square"]] * 8), progress=False)
    assert not list((tmp_path / "run").rglob("*.safetensors"))


def test_finite_unit_inputs_stay_finite_through_a_counterfactual_loss(toy):
    _, editor, images, texts = toy
    U, V = images[:16].clone().requires_grad_(True), texts[:16].clone().requires_grad_(True)
    edited = editor.counterfactuals(V, "text", 3, generator=torch.Generator().manual_seed(0))
    loss = lace_loss(U, V, torch.tensor(10.0), edited.embeddings, edited.valid)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(U.grad).all() and torch.isfinite(V.grad).all()
    assert edited.valid.any()
    assert torch.allclose(edited.embeddings.norm(dim=-1), torch.ones(16, 3))
    assert F.cosine_similarity(edited.embeddings[edited.valid], V.detach()[:, None].expand_as(
        edited.embeddings)[edited.valid], dim=-1).lt(1 - 1e-4).all()
