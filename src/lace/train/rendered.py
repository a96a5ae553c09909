"""The ceiling arm's negatives: each training image's real counterfactual, rendered by the shapes world."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lace.data.world.counterfactuals import render_colour_swaps
from lace.errors import input_error


@dataclass
class RenderedNegatives:
    """pixels (N, 3, H, W) in the model's input format, one per training image; valid (N,) bool."""

    pixels: Tensor
    valid: Tensor

    def batch(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        """Pixels (B, 3, H, W) and validity (B, 1) of the training images `indices`."""
        rows = torch.as_tensor(indices, dtype=torch.long)
        return self.pixels[rows], self.valid[rows][:, None]


def rendered_negatives(world: str | Path, scene_ids: list[str], preprocess) -> RenderedNegatives:
    """The colour-swapped rendering of each scene, preprocessed; a blank image (invalid) where none exists."""
    images = render_colour_swaps(world, scene_ids)
    drawn = [image for image in images if image is not None]
    if not drawn:
        raise input_error(world, "scenes", "at least one training scene with two differently coloured objects",
                          "none")
    blank = torch.zeros_like(preprocess(drawn[0]))
    pixels = torch.stack([preprocess(image) if image is not None else blank for image in images])
    return RenderedNegatives(pixels, torch.tensor([image is not None for image in images]))


def world_of(data: str | None, needed_by: str = "rendered_negatives") -> Path:
    """The shapes world folder a training data file (its karpathy_<style>.json) lies in; needed_by: the switch
    that needs the world, named in the error."""
    if data is None or not (Path(data).parent / "world.json").is_file():
        raise input_error("train config", "data", f"a shapes world's karpathy_<style>.json when {needed_by} is on",
                          data)
    return Path(data).parent
