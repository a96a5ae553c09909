"""Edits of position features at L: binding swap, transplant and attenuate at one object's positions,
the same-size random control, and the effect check.

The operator (`transport`) is any object with `move(features, grid, coverage, source, target)`:
`lace.local.transport.GaussianTransport` or `lace.local.recolour.RecolourRegression`.

Every kernel returns a step (B, P, C) to add to the features, computed without gradient (like the
pooled editor's constant step `(a' - a) D`), and a (B,) validity mask; the tower's upper layers then
run on `features + step`, so the counterfactual keeps its gradient through them and, through the
features, through the layers below L.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lace.local.objects import FoundObjects
from lace.local.reader import PositionConceptReader


def binding_swap(transport, features: Tensor, grid: tuple[int, int],
                 objects: FoundObjects, first: int = 0, second: int = 1) -> tuple[Tensor, Tensor]:
    """Exchange the concepts of two found objects: each one's positions move to the other's concept.

    features (B, P, C) -> step (B, P, C) and valid (B,): both objects found, with different concepts.
    """
    concept_a, concept_b = objects.concept[:, first], objects.concept[:, second]
    step = (transport.move(features, grid, objects.coverage[:, first], concept_a, concept_b)
            + transport.move(features, grid, objects.coverage[:, second], concept_b, concept_a))
    valid = objects.valid[:, first] & objects.valid[:, second] & (concept_a != concept_b)
    return step * valid[:, None, None], valid & (step.flatten(1).norm(dim=1) > 0)


def transplant(transport, features: Tensor, grid: tuple[int, int], objects: FoundObjects,
               which: Tensor, new_concept: Tensor) -> tuple[Tensor, Tensor]:
    """Give object `which[b]` (B,) the concept `new_concept[b]` (B,) at its positions only.

    Valid where the object was found and no found object already has the new concept.
    """
    rows = torch.arange(features.shape[0], device=features.device)
    coverage = objects.coverage[rows, which]  # (B, P)
    source = objects.concept[rows, which]
    step = transport.move(features, grid, coverage, source, new_concept)
    absent = ~((objects.concept == new_concept[:, None]) & objects.valid).any(dim=1)
    valid = objects.valid[rows, which] & absent
    return step * valid[:, None, None], valid & (step.flatten(1).norm(dim=1) > 0)


def attenuate(reader: PositionConceptReader, features: Tensor, objects: FoundObjects, which: Tensor,
              strength: float = 1.0) -> tuple[Tensor, Tensor]:
    """Fade object `which[b]`'s concept at its positions: move each covered position, in proportion to its
    coverage, towards the mean of the positions the reader reads as showing nothing (`reader.nothing_mean_`)."""
    rows = torch.arange(features.shape[0], device=features.device)
    coverage = objects.coverage[rows, which]  # (B, P)
    with torch.no_grad():
        step = strength * coverage[..., None] * (reader.nothing_mean_.to(features.device) - features.detach())
    valid = objects.valid[rows, which]
    return step * valid[:, None, None], valid


def random_control(step: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """A step (B, P, C) with the same norm as `step` at every position, in a random direction."""
    noise = torch.randn(step.shape, generator=generator, dtype=step.dtype).to(step.device)
    norms = step.norm(dim=-1, keepdim=True)
    return noise / noise.norm(dim=-1, keepdim=True).clamp_min(1e-12) * norms


def effect_check(reader: PositionConceptReader, edited: Tensor, coverage: Tensor, source: Tensor,
                 target: Tensor) -> Tensor:
    """(B,) whether the reader, on the edited features (B, P, C), now reads the target concept more than the
    source at the object's positions (coverage (B, P), weights of the average)."""
    shown = reader.probabilities(edited)[..., 1:]  # (B, P, G)
    weights = coverage / coverage.sum(dim=1, keepdim=True).clamp_min(1e-12)
    rows = torch.arange(edited.shape[0], device=edited.device)
    read = (weights[..., None] * shown).sum(dim=1)  # (B, G)
    return read[rows, target] > read[rows, source]
