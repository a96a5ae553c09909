"""Objects and their attributes, found from the features at L themselves.

An object is an attribute concept the position reader finds in the image (in the shapes world
every object has its own colour), and its coverage of each position is the reader's probability
that the position shows that concept. Nothing here reads a scene graph: renderer masks only
measure the result (`mask_iou`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lace.local.reader import PositionConceptReader


@dataclass
class FoundObjects:
    """concept (B, n) long index into the group; coverage (B, n, P) in [0, 1]; valid (B, n) bool."""

    concept: Tensor
    coverage: Tensor
    valid: Tensor


def find_objects(reader: PositionConceptReader, features: Tensor, n_objects: int = 2,
                 min_presence: float = 0.5) -> FoundObjects:
    """The `n_objects` concepts the image most likely shows (B, P, C) -> `FoundObjects`.

    An object is valid when the reader gives its concept a presence of at least `min_presence`.
    Each position goes to at most one object: the one whose concept it most likely shows.
    """
    probabilities = reader.probabilities(features)  # (B, P, 1 + G)
    presence = reader.presence(features, probabilities)  # (B, G)
    top, concept = presence.topk(n_objects, dim=1)  # (B, n)
    shown = probabilities[..., 1:].gather(2, concept[:, None, :].expand(-1, probabilities.shape[1], -1))  # (B, P, n)
    owner = shown.argmax(dim=2, keepdim=True)  # (B, P, 1)
    exclusive = torch.zeros_like(shown).scatter_(2, owner, shown.gather(2, owner))
    return FoundObjects(concept, exclusive.transpose(1, 2), top >= min_presence)


def mask_iou(found: Tensor, truth: Tensor) -> Tensor:
    """IoU (...,) of two boolean masks (..., P); 1 where both are empty."""
    intersection = (found & truth).sum(-1).float()
    union = (found | truth).sum(-1).float()
    return torch.where(union > 0, intersection / union.clamp_min(1), torch.ones_like(union))


def resize_objects(objects: FoundObjects, grid: tuple[int, int], new_grid: tuple[int, int]) -> FoundObjects:
    """Objects found on a (H, W) grid with their coverage averaged onto `new_grid`."""
    if tuple(grid) == tuple(new_grid):
        return objects
    batch, n = objects.concept.shape
    coverage = objects.coverage.reshape(batch * n, 1, *grid)
    resized = torch.nn.functional.adaptive_avg_pool2d(coverage, new_grid).reshape(batch, n, -1)
    return FoundObjects(objects.concept, resized, objects.valid)
