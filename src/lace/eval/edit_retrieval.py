"""Edit retrieval: does a transplant A -> B in an image embedding retrieve real images of B?

For each edited image embedding, look up its k nearest real images and count the share
whose captions mention B, and the share that still show the source image's other
concepts. The two controls are the editor's own (`lace.edits.controls`): the same edits'
step sizes along a random direction, and concept arithmetic along `e_B - e_A`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lace.concepts.image_mentions import flat_captions, image_mentions
from lace.eval.neighbours import topk_neighbours


def edit_angle(original: torch.Tensor, edited: torch.Tensor) -> torch.Tensor:
    """(B,) angle in radians between unit vectors original (B, d) and edited (B, d)."""
    return torch.arccos((original * edited).sum(-1).clamp(-1.0, 1.0))


def edit_retrieval_shares(
    edited: torch.Tensor,
    gallery: torch.Tensor,
    gallery_concepts: torch.Tensor,
    target: torch.Tensor,
    keep: torch.Tensor | None = None,
    source_rows: torch.Tensor | None = None,
    k: int = 10,
) -> dict[str, float]:
    """Shares of the k nearest real images that show the target, and that keep the rest.

    Args:
        edited: (B, d) edited image embeddings (unit).
        gallery: (N, d) real image embeddings (unit).
        gallery_concepts: (N, C) bool, concepts each gallery image's captions mention.
        target: (B,) concept index B of each edit.
        keep: (B, C) bool, other concepts of each source image that should stay.
        source_rows: (B,) gallery row of each source image, left out of its own neighbours.
        k: neighbours looked up.

    Returns:
        target: mean share of neighbours mentioning the target concept;
        keep: mean share of neighbours mentioning every kept concept (rows with something to keep).
    """
    gallery_concepts = torch.as_tensor(gallery_concepts).bool()
    depth = k + (1 if source_rows is not None else 0)
    neighbours = topk_neighbours(edited, gallery, depth).indices  # (B, depth)
    if source_rows is not None:
        not_source = neighbours != torch.as_tensor(source_rows)[:, None]
        # keep the first k neighbours that are not the source image
        order = torch.argsort((~not_source).to(torch.int8), dim=1, stable=True)
        neighbours = neighbours.gather(1, order)[:, :k]
    else:
        neighbours = neighbours[:, :k]
    shown = gallery_concepts[neighbours]  # (B, k, C)
    target_share = shown.gather(2, torch.as_tensor(target)[:, None, None].expand(-1, neighbours.shape[1], 1))
    figures = {"target": float(target_share.float().mean())}
    if keep is not None:
        keep = torch.as_tensor(keep).bool()
        has_keep = keep.any(dim=1)
        if has_keep.any():
            kept = (shown | ~keep[:, None, :]).all(dim=2)  # (B, k)
            figures["keep"] = float(kept[has_keep].float().mean())
    return figures


def edit_retrieval(
    original: torch.Tensor,
    edits: dict[str, torch.Tensor],
    gallery: torch.Tensor,
    gallery_concepts: torch.Tensor,
    target: torch.Tensor,
    keep: torch.Tensor | None = None,
    source_rows: torch.Tensor | None = None,
    k: int = 10,
) -> dict[str, float]:
    """Edit retrieval of transplants A -> B and of their controls.

    Args:
        original: (B, d) source image embeddings.
        edits: (B, d) edited embeddings by name: `transplant` and its controls (`random`,
            `arithmetic`, from `CounterfactualEditor.apply(..., control=...)`).
        target: (B,) concept index B of each edit.
        Other arguments as in `edit_retrieval_shares`.

    Returns `<name>/target` (and `<name>/keep`) per edit, plus `angle_degrees`, the mean
    angle of the transplants from the originals.
    """
    original = torch.as_tensor(original).float()
    angle = edit_angle(original, torch.as_tensor(edits["transplant"]).float())  # (B,)
    figures: dict[str, float] = {"angle_degrees": float(torch.rad2deg(angle).mean())}
    for name, edited in edits.items():
        shares = edit_retrieval_shares(torch.as_tensor(edited).float(), gallery, gallery_concepts, target, keep,
                                       source_rows, k)
        figures.update({f"{name}/{key}": value for key, value in shares.items()})
    return figures


def caption_concepts(captions_per_image: Sequence[Sequence[str]], rule_negatives,
                     min_captions: int = 1) -> tuple[torch.Tensor, list[str]]:
    """(N, C) bool: which vocabulary concepts at least `min_captions` of each image's captions mention, and the
    concept names.

    Uses `rule_negatives.mentions(caption)` (vocabulary phrase matching with plurals and
    relation synonyms) so that "dogs" counts as "dog"; counted by `lace.concepts.image_mentions`.
    """
    names = list(rule_negatives.objects) + [w for ws in rule_negatives.attribute_groups.values() for w in ws] + list(
        rule_negatives.relations)
    column = {name: i for i, name in enumerate(names)}

    def match(captions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        pairs = [(row, column[mention.concept]) for row, caption in enumerate(captions)
                 for mention in rule_negatives.mentions(caption) if mention.concept in column]
        return np.array([r for r, _ in pairs], dtype=np.int64), np.array([c for _, c in pairs], dtype=np.int64)

    captions, owner = flat_captions(captions_per_image)
    counts = image_mentions(captions, owner, len(captions_per_image), match, len(names))  # (N, C)
    return torch.from_numpy(counts >= min_captions), names
