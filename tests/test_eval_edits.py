"""Brittleness and edit retrieval on hand-built embeddings and small fakes."""


import pytest
import torch
import torch.nn.functional as F

from lace.concepts.vocabulary import load_vocabulary
from lace.edits.captions import RuleNegatives
from lace.edits.records import Counterfactuals
from lace.eval import brittleness
from lace.eval.brittleness import (
    brittleness_rate,
    counterfactual_brittleness,
    rule_edit_brittleness,
    rule_edits,
)
from lace.eval.edit_retrieval import (
    edit_angle,
    edit_retrieval,
    edit_retrieval_shares,
)


def test_brittleness_rate_counts_valid_edits_that_outscore_the_caption():
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    captions = torch.tensor([[0.8, 0.6], [0.6, 0.8]])  # true scores 0.8, 0.8
    edited = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])  # scores 1, 0 | 1, 0
    assert brittleness_rate(images, captions, edited) == pytest.approx(0.5)
    valid = torch.tensor([[True, False], [False, False]])
    assert brittleness_rate(images, captions, edited, valid) == pytest.approx(1.0)


class TableEncoder:
    embed_dim = 2

    def __init__(self, table):
        self.table = table

    def eval(self):
        return self

    def encode_texts(self, texts):
        return F.normalize(torch.tensor([self.table[t] for t in texts], dtype=torch.float32), dim=-1)


class SwapColours:
    kinds = ("replace_attribute",)

    def make(self, caption, kind, rng):
        return {"red dog": "blue dog", "blue cat": "red cat"}.get(caption)


def test_rule_edit_brittleness_encodes_the_edits_as_captions():
    encoder = TableEncoder({"blue dog": (1.0, 0.0), "red cat": (0.0, 1.0)})
    images = torch.tensor([[1.0, 0.0]])
    captions = ["red dog", "blue cat", "a dog"]  # the last has no edit
    texts = F.normalize(torch.tensor([[0.9, 0.1], [0.5, 0.5], [1.0, 0.0]]), dim=1)
    figures = rule_edit_brittleness(encoder, images, captions, texts, [0, 0, 0], SwapColours())
    # "blue dog" scores 1.0 > s(red dog) ~ 0.99: brittle; "red cat" scores 0 < 0.71: fine
    assert figures == {"rule/n_triples": 2.0, "rule/all": 0.5, "rule/replace_attribute": 0.5}


def test_rule_edits_are_made_once_per_arguments_and_equal_a_fresh_draw(monkeypatch):
    """Every model evaluated on the same captions is measured on the same edits, made once per process: a
    second call returns what a fresh draw makes, and another seed draws other edits."""
    monkeypatch.setattr(brittleness, "_rule_edit_sets", {})
    rules = RuleNegatives(load_vocabulary("natural"))
    captions = tuple(f"a {colour} dog next to a {other} cat" for colour, other in
                     [("red", "blue"), ("green", "white"), ("black", "brown")] * 4)
    kinds = rules.kinds
    first = rule_edits(rules, captions, kinds, 8, seed=0)
    assert len(first[0]) == len(first[1]) > 0 and len(brittleness._rule_edit_sets) == 1
    assert rule_edits(rules, captions, kinds, 8, seed=0) is first
    brittleness._rule_edit_sets.clear()
    assert rule_edits(rules, captions, kinds, 8, seed=0) == first
    assert rule_edits(rules, captions, kinds, 8, seed=1) != first


class FakeEditor:
    def counterfactuals(self, z, modality, n_edits):
        assert modality == "text"
        flipped = torch.stack([z.flip(-1), z], dim=1)  # (B, 2, d): a flip and an identical copy
        valid = torch.tensor([[True, True]] * z.shape[0])
        return Counterfactuals(flipped, valid, records=None)


def test_counterfactual_brittleness_uses_the_editor_output():
    images = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    texts = F.normalize(torch.tensor([[0.2, 0.9], [0.9, 0.2]]), dim=1)
    figures = counterfactual_brittleness(FakeEditor(), images, texts, [0, 1], n_edits=2, batch_size=1)
    # caption 0 flipped to (0.9, 0.2) beats it; caption 1's flip loses; identical copies tie (not brittle)
    assert figures == {"counterfactual/all": 0.25, "counterfactual/n_triples": 4.0}


def _rotate_towards(z, direction, angle):
    """z (B, d) moved by `angle` (B,) towards `direction` (B, d)."""
    orthogonal = F.normalize(direction - (direction * z).sum(-1, keepdim=True) * z, dim=-1)
    return torch.cos(angle)[:, None] * z + torch.sin(angle)[:, None] * orthogonal


def test_controls_keep_the_step_size():
    from lace.edits.controls import arithmetic_step, random_step
    from lace.edits.kernels import ATTENUATE, REBIND, SWAP, TRANSPLANT

    torch.manual_seed(0)
    step = torch.randn(3, 4, 8)
    size = step.norm(dim=-1)
    moved = random_step(step, size, torch.Generator().manual_seed(0))
    torch.testing.assert_close(moved.norm(dim=-1), size)
    kind = torch.tensor([[ATTENUATE, SWAP, TRANSPLANT, REBIND]] * 3)
    source, target = F.normalize(torch.randn(3, 4, 8), dim=-1), F.normalize(torch.randn(3, 4, 8), dim=-1)
    along = arithmetic_step(kind, step, size, source, target, torch.ones(3, 4), torch.zeros(3, 4))
    torch.testing.assert_close(along.norm(dim=-1), size)
    torch.testing.assert_close(along[:, 0], -source[:, 0] * size[:, 0, None])  # attenuate: against e_c
    torch.testing.assert_close(along[:, 3], step[:, 3])  # rebind: its own step


def test_edit_retrieval_finds_target_images_and_controls_do_not():
    # gallery: 4 "dog on grass" images near e0, 4 "dog on snow" images near e1; concepts dog, grass, snow
    directions = torch.eye(3, 6)  # e_dog, e_grass, e_snow
    base = F.normalize(torch.tensor([1.0, 1.0, 0, 0, 0, 0]), dim=0)
    snow = F.normalize(torch.tensor([1.0, 0, 1.0, 0, 0, 0]), dim=0)
    generator = torch.Generator().manual_seed(0)
    gallery = F.normalize(torch.cat([base.repeat(4, 1), snow.repeat(4, 1)]) + 0.05 * torch.randn(8, 6, generator=generator), dim=1)
    concepts = torch.tensor([[1, 1, 0]] * 4 + [[1, 0, 1]] * 4, dtype=torch.bool)
    original = gallery[:2]
    transplanted = F.normalize(original - 0.7 * directions[1] + 0.7 * directions[2], dim=1)
    source, target = torch.tensor([1, 1]), torch.tensor([2, 2])
    keep = torch.tensor([[True, False, False]] * 2)  # the dog should stay
    angle = edit_angle(original, transplanted)
    edits = {"transplant": transplanted,
             "random": _rotate_towards(original, torch.randn(original.shape, generator=generator), angle),
             "arithmetic": _rotate_towards(original, directions[target] - directions[source], angle)}
    figures = edit_retrieval(original, edits, gallery, concepts, target, keep=keep, source_rows=torch.tensor([0, 1]), k=3)
    assert figures["transplant/target"] == 1.0 and figures["arithmetic/target"] == 1.0
    assert figures["transplant/keep"] == 1.0
    assert figures["random/target"] < 1.0
    shares = edit_retrieval_shares(original, gallery, concepts, target, source_rows=torch.tensor([0, 1]), k=3)
    assert shares["target"] == 0.0  # unedited: neighbours are grass images, the source left out
