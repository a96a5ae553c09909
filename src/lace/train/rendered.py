"""The ceiling arm's negatives: each training image's real counterfactual, rendered by the shapes world."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from lace.data.world.counterfactuals import render_colour_swaps, swapped_colours
from lace.errors import input_error


@dataclass
class RenderedNegatives:
    """pixels (N, 3, H, W) in the model's input format, one per training image; valid (N,) bool; changes: per
    image the colour words its swap exchanges (None where invalid), from which the pairs layout writes the caption
    the swapped rendering shows."""

    pixels: Tensor
    valid: Tensor
    changes: list[dict[str, str] | None] = field(default_factory=list)

    def batch(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        """Pixels (B, 3, H, W) and validity (B, 1) of the training images `indices`."""
        rows = torch.as_tensor(indices, dtype=torch.long)
        return self.pixels[rows], self.valid[rows][:, None]

    def batch_changes(self, indices: list[int]) -> list[list[dict[str, str] | None]]:
        """Per training image of `indices`, its one slot's change (as `lace.train.pairs` reads them)."""
        if len(self.changes) != len(self.valid):
            raise input_error("rendered negatives", "changes", f"one per training image ({len(self.valid)})",
                              len(self.changes))
        return [[self.changes[index]] for index in indices]


def rendered_negatives(world: str | Path, scene_ids: list[str], preprocess) -> RenderedNegatives:
    """The colour-swapped rendering of each scene, preprocessed; a blank image (invalid) where none exists."""
    images = render_colour_swaps(world, scene_ids)
    drawn = [image for image in images if image is not None]
    if not drawn:
        raise input_error(world, "scenes", "at least one training scene with two differently coloured objects",
                          "none")
    blank = torch.zeros_like(preprocess(drawn[0]))
    pixels = torch.stack([preprocess(image) if image is not None else blank for image in images])
    return RenderedNegatives(pixels, torch.tensor([image is not None for image in images]),
                             swapped_colours(world, scene_ids))


def world_of(data: str | None, needed_by: str = "rendered_negatives") -> Path:
    """The shapes world folder a training data file (its karpathy_<style>.json) lies in; needed_by: the switch
    that needs the world, named in the error."""
    if data is None or not (Path(data).parent / "world.json").is_file():
        raise input_error("train config", "data", f"a shapes world's karpathy_<style>.json when {needed_by} is on",
                          data)
    return Path(data).parent
