"""The provenance probe of `lace fidelity`: can a linear probe on the model's embeddings tell an operator's edits
from real images (`lace.provenance.real_vs_edited_auc`)?

The probe is fitted on training images that no operator was fitted on (the `n_probe` images after the first
`n_train`): their real embeddings against those of their binding swaps by the operator measured; it is scored on
the validation swap items (real images against their edits). The same probe on the world's rendered colour swaps
(real counterfactual images: fitted on the same training scenes, scored on the items' rendered negatives) is the
reference an operator aims at: AUC 0.5 when nothing tells the two apart.

    probe = probe_images(encoder, world, train, start=n_train, count=n_probe)
    rendered_probe_auc(encoder, probe, data)                 # the reference
    edit_probe_auc(split, operator, locate, probe, u_val, u_val_edit, val_valid)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lace.local.edits import binding_swap
from lace.local.towers import ImageTowerSplit
from lace.provenance import real_vs_edited_auc
from lace.train.rendered import rendered_negatives

BATCH = 500


@dataclass
class ProbeImages:
    """The probe's training images: pixels (N, 3, H, W) and their rendered colour swaps (N, 3, H, W) in the model's
    input format, rendered_valid (N,) bool (a scene with two colours to swap)."""

    pixels: Tensor
    rendered: Tensor
    rendered_valid: Tensor


def probe_images(encoder, world: Path, train, start: int, count: int) -> ProbeImages | None:
    """Training images start .. start + count of the dataset `train` (None when there are none)."""
    stop = min(start + count, len(train))
    if stop <= start:
        return None
    pixels = torch.stack([encoder.preprocess(train.load_image(i)) for i in range(start, stop)])
    scene_ids = [Path(train.records[i].image_path).stem for i in range(start, stop)]
    swaps = rendered_negatives(world, scene_ids, encoder.preprocess)
    return ProbeImages(pixels, swaps.pixels, swaps.valid)


def _batched(function, *tensors: Tensor) -> Tensor:
    return torch.cat([function(*(t[i:i + BATCH] for t in tensors)) for i in range(0, len(tensors[0]), BATCH)])


def rendered_probe_auc(encoder, probe: ProbeImages, data: dict[str, Tensor]) -> float | None:
    """The probe's AUC on the rendered swaps: fitted on the probe images against their renderings, scored on the
    items' images data["u"] (N, d) against their rendered negatives data["u_rendered"]."""
    valid = probe.rendered_valid
    if valid.sum() < 2:
        return None
    real = _batched(encoder.encode_images, probe.pixels[valid])
    rendered = _batched(encoder.encode_images, probe.rendered[valid])
    return real_vs_edited_auc(real, rendered, data["u"], data["u_rendered"])


def edit_probe_auc(split: ImageTowerSplit, operator, locate, probe: ProbeImages, u: Tensor, u_edit: Tensor,
                   valid: Tensor) -> float | None:
    """The probe's AUC on an operator's binding swaps at `split`'s layer: fitted on the probe images against their
    swaps (objects found by `locate(pixels, features)`), scored on the items' unit embeddings u (N, d) against
    their swaps u_edit (N, d) where `valid` (N,); None with fewer than two swaps on either side."""

    def swapped(pixels: Tensor) -> Tensor:
        features = split.regions(split.lower(pixels))
        step, made = binding_swap(operator, features, split.grid, locate(pixels, features))
        return torch.cat([split.upper(features), split.upper(features + step), made[:, None].float()], dim=1)

    rows = _batched(swapped, probe.pixels)
    made = rows[:, -1].bool()
    if made.sum() < 2 or valid.sum() < 2:
        return None
    dim = u.shape[1]
    return real_vs_edited_auc(rows[made, :dim], rows[made, dim:2 * dim], u[valid], u_edit[valid])


__all__ = ["ProbeImages", "edit_probe_auc", "probe_images", "rendered_probe_auc"]
