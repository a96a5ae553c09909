"""Counterfactual edits: same-type rules, step sizes, gradients, effect check, records."""

from __future__ import annotations

import pytest
import torch

from lace.edits import EDIT_KINDS, CounterfactualEditor, EditConfig, edit_report, parse_edit
from lace.errors import LaceInputError
from tests.toy_concepts import toy_fitted


@pytest.fixture(scope="module")
def toy():
    return toy_fitted(300)


def _editor(toy, **options) -> CounterfactualEditor:
    directions, dictionary, labelling, _, _ = toy
    return CounterfactualEditor(dictionary, labelling, directions, EditConfig(**options))


def test_zero_step_rebuilds_the_input_exactly(toy):
    editor = _editor(toy)
    images = toy[3][:20]
    rebuilt = editor._rebuild(images, "image", torch.zeros(20, 3, images.shape[1]))
    torch.testing.assert_close(rebuilt, images.unsqueeze(1).expand(20, 3, -1), atol=1e-6, rtol=1e-6)


def test_edits_stay_within_type_and_change_the_named_concepts(toy):
    directions, _, _, images, _ = toy
    editor = _editor(toy)
    edits = editor.counterfactuals(images[:64], "image", 8, torch.Generator().manual_seed(0))
    records = edits.records
    assert edits.embeddings.shape == (64, 8, 32) and edits.valid.shape == (64, 8)
    assert edits.valid.float().mean() > 0.8
    torch.testing.assert_close(edits.embeddings.norm(dim=-1), torch.ones(64, 8))
    groups = directions.group_ids()
    kinds = {EDIT_KINDS[k] for k in records.kind[records.proposed].tolist()}
    assert kinds == set(EDIT_KINDS) - {"rebind"}  # rebind needs binding directions, which this editor lacks
    has_target = records.proposed & (records.target >= 0)
    assert (groups[records.source[has_target]] == groups[records.target[has_target]]).all()
    assert (records.source[has_target] != records.target[has_target]).all()
    transplant = records.proposed & (records.kind == EDIT_KINDS.index("transplant"))
    assert (records.target_weight_before[transplant] == 0).all()
    torch.testing.assert_close(records.target_weight_after[transplant], records.source_weight_before[transplant])
    assert (records.source_weight_after[transplant] == 0).all()


def test_hard_target_is_the_closest_same_type_concept(toy):
    directions = toy[0]
    editor = _editor(toy, kinds=("transplant",), target="hard")
    edits = editor.counterfactuals(toy[3][:40], "image", 2, torch.Generator().manual_seed(1))
    similarity = directions.directions @ directions.directions.T
    same_type = directions.same_type()
    records = edits.records
    for b, m in records.proposed.nonzero().tolist():
        source, target = int(records.source[b, m]), int(records.target[b, m])
        weights = toy[1].transform(toy[3][b : b + 1], "image", dense=True)[0]
        candidates = [c for c in range(len(directions)) if same_type[source, c] and c != source and weights[c] == 0]
        assert target == max(candidates, key=lambda c: float(similarity[source, c]))


def test_named_transplant_and_its_errors(toy):
    directions, _, _, images, _ = toy
    editor = _editor(toy)
    edits = editor.apply(images[:50], "image", "transplant:circle=star")
    records = edits.records
    has_circle = toy[1].transform(images[:50], "image", dense=True)[:, directions.index("circle")] > 0
    has_star = toy[1].transform(images[:50], "image", dense=True)[:, directions.index("star")] > 0
    assert torch.equal(records.proposed[:, 0], has_circle & ~has_star)
    assert (records.target[records.proposed] == directions.index("star")).all()
    assert edits.valid[records.proposed].all()
    # the transplanted embedding reads more "star" than before
    star = directions.directions[directions.index("star")]
    before = toy[1].centre(images[:50], "image")[0] @ star
    after = toy[1].centre(edits.embeddings[:, 0], "image")[0] @ star
    assert (after[records.proposed[:, 0]] > before[records.proposed[:, 0]]).all()
    with pytest.raises(LaceInputError, match="same type"):
        editor.apply(images[:5], "image", "transplant:red=star")
    with pytest.raises(LaceInputError, match="zebra"):
        editor.apply(images[:5], "image", "transplant:circle=zebra")
    with pytest.raises(LaceInputError, match="same type"):
        _editor(toy, target="red=circle")
    with pytest.raises(LaceInputError):
        parse_edit("transplant:circle")


def test_named_target_in_training_mode_uses_only_that_pair(toy):
    directions = toy[0]
    editor = _editor(toy, kinds=("transplant",), target="red=blue")
    edits = editor.counterfactuals(toy[3][:60], "image", 2, torch.Generator().manual_seed(0))
    records = edits.records
    assert records.proposed.any()
    assert (records.source[records.proposed] == directions.index("red")).all()
    assert (records.target[records.proposed] == directions.index("blue")).all()


def _unit_with_centred_direction(mean: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """The unit vector z = mean + t u (t > 0, u = direction / |direction|)."""
    u = direction / direction.norm()
    projection = mean @ u
    t = -projection + torch.sqrt(projection**2 + 1 - mean @ mean)
    return mean + t * u


def test_swaps_of_equal_weights_are_skipped(toy):
    directions, dictionary, _, _, _ = toy
    circle, square = directions.directions[directions.index("circle")], directions.directions[directions.index("square")]
    equal = _unit_with_centred_direction(dictionary.mean_image_, circle + square)
    unequal = _unit_with_centred_direction(dictionary.mean_image_, circle + 0.5 * square)
    editor = _editor(toy, kinds=("swap",))
    edits = editor.apply(torch.stack([equal, unequal]), "image", "swap:circle=square")
    assert edits.records.proposed[:, 0].tolist() == [False, True]
    assert edits.valid[1, 0]
    records = edits.records
    torch.testing.assert_close(records.source_weight_after[1], records.target_weight_before[1])
    torch.testing.assert_close(records.target_weight_after[1], records.source_weight_before[1])


def test_controls_use_the_same_edits_and_step_sizes(toy):
    editor = _editor(toy)
    images = toy[3][:64]
    edits = editor.counterfactuals(images, "image", 4, torch.Generator().manual_seed(7))
    for control in (editor.random_control, editor.concept_arithmetic):
        other = control(images, "image", 4, torch.Generator().manual_seed(7))
        assert torch.equal(other.records.kind, edits.records.kind)
        assert torch.equal(other.valid, edits.valid)
        torch.testing.assert_close(other.records.step_size, edits.records.step_size)
        if control == editor.random_control:
            assert not torch.allclose(other.embeddings, edits.embeddings)
        else:  # vocabulary atoms are the concept directions: the arithmetic twin is the edit itself
            torch.testing.assert_close(other.embeddings, edits.embeddings, atol=1e-5, rtol=1e-5)
    plan = editor._plan(images, "image", 4, torch.Generator().manual_seed(7))
    for control in ("random", "concept_arithmetic"):
        step = editor._control_step(plan, control, torch.Generator().manual_seed(1))
        torch.testing.assert_close(step.norm(dim=-1), plan.step.norm(dim=-1), atol=1e-5, rtol=1e-5)
    # a random edit of the same size rarely does what a transplant says
    random_edit = editor.random_control(images, "image", 4, torch.Generator().manual_seed(7))
    transplant = edits.records.proposed & (edits.records.kind == EDIT_KINDS.index("transplant"))
    assert random_edit.records.passed_check[transplant].float().mean() < edits.records.passed_check[transplant].float().mean()


def test_gradient_flows_to_the_input(toy):
    editor = _editor(toy)
    z = toy[4][:16].clone().requires_grad_(True)
    edits = editor.counterfactuals(z, "text", 3, torch.Generator().manual_seed(0))
    (edits.embeddings[edits.valid] * torch.randn(32)).sum().backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    assert torch.isfinite(z.grad).all()


def test_effect_check_rejects_an_edit_that_does_nothing(toy):
    images = toy[3][:32]
    # gamma just under 1: the attenuation barely changes the code
    idle = _editor(toy, kinds=("attenuate",), gamma=0.999)
    edits = idle.counterfactuals(images, "image", 2, torch.Generator().manual_seed(0))
    assert edits.records.proposed.all()
    assert not edits.records.passed_check.any() and not edits.valid.any()
    real = _editor(toy, kinds=("attenuate",), gamma=0.0).counterfactuals(images, "image", 2, torch.Generator().manual_seed(0))
    assert real.valid.all()
    # without the check every proposed edit is kept
    unchecked = _editor(toy, kinds=("attenuate",), gamma=0.999, effect_check=False)
    assert unchecked.counterfactuals(images, "image", 2, torch.Generator().manual_seed(0)).valid.all()


def test_atom_level_edits_and_records(toy):
    directions = toy[0]
    editor = _editor(toy, atom_level=True)
    edits = editor.counterfactuals(toy[3][:8], "image", 2, torch.Generator().manual_seed(0))
    rows = edits.records.to_dicts(editor.unit_names, editor.unit_atoms)
    assert len(rows) == 16
    proposed = [row for row in rows if row["proposed"]]
    assert proposed and all(row["source"].split("#")[0] in directions.names for row in proposed)
    assert all(len(row["atoms"]) == (1 if row["kind"] == "attenuate" else 2) for row in proposed)


def test_report_compares_edits_with_random_control(toy):
    editor = _editor(toy)
    report = edit_report(editor, toy[3][:100], "image", toy[4], n_edits=4)
    assert set(report) == set(EDIT_KINDS)
    assert report["transplant"]["passed_check_share"] > 0.9
    assert report["transplant"]["nearest_changed_share"] > report["transplant"]["random_nearest_changed_share"]


def test_bad_input(toy):
    editor = _editor(toy)
    with pytest.raises(LaceInputError, match=r"\(B, 32\)"):
        editor.counterfactuals(torch.zeros(4, 16), "image", 2)
    with pytest.raises(LaceInputError, match="gamma"):
        _editor(toy, gamma=1.0)
    with pytest.raises(LaceInputError, match="kinds"):
        _editor(toy, kinds=("blend",))
