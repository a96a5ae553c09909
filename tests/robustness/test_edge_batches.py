"""Empty and single-sample batches, embeddings with nothing to edit, and duplicate pairs in a batch.

Decided (docs/robustness.md, "Numeric and batch edge cases"):
- an empty batch has no contrastive loss and is refused; the editor returns (0, M, d) for it;
- a single pair has a plain loss of exactly 0 and no gradient (its only column is its match); its
  counterfactual negatives still give a positive, finite loss; the trainer runs with batch size 1;
- an embedding with no editable concept (here: one at its modality's mean, and one made only of an
  atom no concept owns) gets no valid counterfactual, and its rows are exactly the plain loss;
- duplicate images or captions in a batch stay negatives of each other by default, exactly as in
  open_clip's `ClipLoss`; `false_negatives` (built by `duplicate_pairs`) takes them out of the softmax.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss

from lace.concepts.labelling import label_atoms
from lace.dictionary import ConceptDictionary
from lace.edits import CounterfactualEditor, EditConfig
from lace.errors import LaceInputError
from lace.eval.diagnostics import geometry_diagnostics
from lace.io import read_json
from lace.losses import clip_loss, duplicate_pairs, lace_loss
from lace.train import TensorPairs, train
from lace.train.config import train_config
from tests.toy_concepts import toy_directions, toy_editor


@pytest.fixture(scope="module")
def toy():
    return toy_editor(200)


def unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_an_empty_batch_is_refused_by_the_loss_and_edited_to_nothing(toy):
    _, editor, images, texts = toy
    with pytest.raises(LaceInputError, match=r"B >= 1"):
        clip_loss(images[:0], texts[:0], torch.tensor(10.0))
    edited = editor.counterfactuals(images[:0], "image", 3)
    assert edited.embeddings.shape == (0, 3, 32) and edited.valid.shape == (0, 3)


def test_a_single_pair_has_zero_plain_loss_and_its_negatives_still_count(toy):
    _, editor, images, texts = toy
    U, V = images[:1].clone().requires_grad_(True), texts[:1].clone().requires_grad_(True)
    scale = torch.tensor(10.0)
    plain = clip_loss(U, V, scale)
    assert plain.item() == 0.0
    torch.testing.assert_close(plain, ClipLoss()(U, V, scale))
    edited = editor.counterfactuals(V, "text", 4, generator=torch.Generator().manual_seed(1))
    assert edited.embeddings.shape == (1, 4, 32)
    negatives = F.normalize(V.detach()[:, None] + 0.2 * unit(1, 2, 32, seed=3), dim=-1)
    loss = lace_loss(U, V, scale, negatives, None)
    loss.backward()
    assert loss.item() > 0 and torch.isfinite(U.grad).all() and U.grad.abs().sum() > 0


def _unit_with_centred_direction(mean: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """The unit vector z = mean + t u (t > 0, u = direction / |direction|)."""
    u = direction / direction.norm()
    projection = mean @ u
    return mean + (-projection + torch.sqrt(projection**2 + 1 - mean @ mean)) * u


def _no_editable_concept(dictionary: ConceptDictionary, editor: CounterfactualEditor) -> torch.Tensor:
    """(2, d) unit image embeddings: one whose centred direction is orthogonal to every atom (a zero code),
    one whose centred direction is an atom no concept owns."""
    atoms = dictionary.atoms_.double()
    away = torch.randn(atoms.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    away = away - atoms.T @ torch.linalg.lstsq(atoms.T, away).solution  # out of the atoms' span
    owned = editor.planner.tables(torch.device("cpu"))["ownership_t"].any(0)  # (K,) atoms some unit owns
    assert not owned.all(), "the test needs an atom that no concept owns"
    unowned = dictionary.atoms_[int((~owned).nonzero()[0, 0])]
    mean = dictionary.mean_image_
    return torch.stack([_unit_with_centred_direction(mean, away.float()), _unit_with_centred_direction(mean, unowned)])


def test_an_embedding_with_no_editable_atom_gets_no_counterfactual_and_the_plain_loss(toy):
    dictionary, _, images, texts = toy
    directions = toy_directions()
    labelling = label_atoms(dictionary, directions, images, texts)
    # drop one concept's atom from the labelling's ownership: an embedding made of it has nothing to edit
    labelling.atom_alignment[0] = -1.0
    editor = CounterfactualEditor(dictionary, labelling, directions, EditConfig())
    z = _no_editable_concept(dictionary, editor)
    codes = dictionary.transform(z, "image", dense=True)  # (2, K)
    assert codes[0].abs().max() < 1e-5 and codes[1].count_nonzero() == 1
    for make in (editor.counterfactuals, editor.concept_arithmetic, editor.random_control):
        edited = make(z, "image", 3, generator=torch.Generator().manual_seed(0))
        assert not edited.valid.any() and not edited.records.proposed.any()
        assert torch.isfinite(edited.embeddings).all()
    U = torch.cat([z, images[:6]]).requires_grad_(True)
    V = texts[:8]
    edited = editor.counterfactuals(U, "image", 3, generator=torch.Generator().manual_seed(0))
    scale = torch.tensor(10.0)
    loss = lace_loss(U, V, scale, image_negatives=edited.embeddings, image_valid=edited.valid)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(U.grad).all()
    rows = torch.arange(8)
    t2i = torch.cat([scale * V @ U.T, torch.where(edited.valid, scale * torch.einsum("bd,bmd->bm", V, edited.embeddings),
                                                   torch.tensor(float("-inf")))], dim=1)
    assert torch.isinf(t2i[:2, 8:]).all()  # the two rows without an editable concept: plain CLIP rows
    expected = 0.5 * (F.cross_entropy(scale * U @ V.T, rows) + F.cross_entropy(t2i, rows))
    torch.testing.assert_close(loss, expected)


def test_geometry_of_one_image_and_one_caption(toy):
    _, _, images, texts = toy
    figures = geometry_diagnostics(images[:1], texts[:1], [0])
    assert figures["i2t/R@1"] == figures["t2i/R@1"] == 1.0
    assert figures["one_way/image"] == figures["one_way/text"] == 0.0
    with pytest.raises(LaceInputError, match="at least one each"):
        geometry_diagnostics(images[:0], texts[:0], [])


def test_the_trainer_runs_single_sample_batches(tmp_path):
    pixels = torch.randn(4, 3, 32, 32)
    config = train_config(model="lace-micro-32", output=str(tmp_path / "run"), steps=2, batch_size=1, lr=1e-3,
                         warmup_steps=0, log_every=1, checkpoint_every=2, device="cpu", seed=0)
    result = train(config, dataset=TensorPairs(pixels, [["a red square"], ["a blue circle"]] * 2), progress=False)
    assert result.steps == 2 and result.checkpoint_path.is_file()
    lines = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line]
    assert [json.loads(line)["plain_loss"] for line in lines] == [0.0, 0.0]
    assert read_json(tmp_path / "run" / "config.json")["batch_size"] == 1


def test_duplicates_are_negatives_by_default_as_in_open_clip():
    U, V = unit(8, 16, seed=1), unit(8, 16, seed=2)
    U[5], V[6] = U[1], V[2]  # pair 5 repeats pair 1's image, pair 6 repeats pair 2's caption
    scale = torch.tensor(12.0)
    torch.testing.assert_close(clip_loss(U, V, scale), ClipLoss()(U, V, scale))
    none_marked = torch.zeros(8, 8, dtype=torch.bool)
    torch.testing.assert_close(clip_loss(U, V, scale, false_negatives=none_marked), clip_loss(U, V, scale))


def test_false_negatives_leave_the_duplicates_out_of_both_softmaxes():
    U, V = unit(8, 16, seed=1), unit(8, 16, seed=2)
    U[5], V[6] = U[1], V[2]
    image_keys = torch.tensor([0, 1, 2, 3, 4, 1, 6, 7])
    caption_keys = torch.tensor([0, 1, 2, 3, 4, 5, 2, 7])
    mask = duplicate_pairs(image_keys, caption_keys)
    assert mask.sum() == 4 and mask[1, 5] and mask[5, 1] and mask[2, 6] and mask[6, 2] and not mask.diagonal().any()
    scale = torch.tensor(12.0)
    expected = 0.0
    for i in range(8):
        kept = [j for j in range(8) if not mask[i, j]]
        target = kept.index(i)
        expected += -torch.log_softmax(scale * U[i] @ V[kept].T, 0)[target]
        expected += -torch.log_softmax(scale * V[i] @ U[kept].T, 0)[target]
    torch.testing.assert_close(clip_loss(U, V, scale, false_negatives=mask), expected / 16)
    assert clip_loss(U, V, scale, false_negatives=mask) < clip_loss(U, V, scale)
    marked_diagonal = mask | torch.eye(8, dtype=torch.bool)  # a row's own pair is never masked
    torch.testing.assert_close(clip_loss(U, V, scale, false_negatives=marked_diagonal), expected / 16)


def test_false_negatives_across_processes_use_the_gathered_keys():
    U, V = unit(8, 16, seed=4), unit(8, 16, seed=5)
    U[6] = U[1]
    image_keys, caption_keys = torch.tensor([0, 1, 2, 3, 4, 5, 1, 7]), torch.arange(8)
    whole = clip_loss(U, V, torch.tensor(9.0), false_negatives=duplicate_pairs(image_keys, caption_keys))
    shards = []
    for rank in range(2):
        rows = slice(4 * rank, 4 * rank + 4)
        mask = duplicate_pairs(image_keys[rows], caption_keys[rows], image_keys, caption_keys, row_offset=4 * rank)
        shards.append(clip_loss(U[rows], V[rows], torch.tensor(9.0), gallery_images=U, gallery_texts=V,
                                row_offset=4 * rank, false_negatives=mask))
    torch.testing.assert_close(torch.stack(shards).mean(), whole)
