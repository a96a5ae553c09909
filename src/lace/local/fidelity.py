"""The measurement of local image edits against a shapes world's rendered counterfactuals, one family of
benchmark items at a time: `lace fidelity`'s tables (`lace.experiment.fidelity`) and the fidelity a LACE-local
run logs while it trains (`lace.train.local_refresh`) both take their figures from here.

    items = benchmark_items(world, "val", "swap_attribute", 64)
    pixels = item_pixels(encoder, world, items)                 # fixed: read once
    with torch.no_grad():
        figures = swap_fidelity(encoder.model, editor, family_data(encoder, pixels, items), generator)
    figures["edit"]["direction_agreement"]                      # mean cos(u_edit - u, u_rendered - u)
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from lace.io import read_json
from lace.local.editor import LocalImageEditor
from lace.local.edits import binding_swap, random_control
from lace.local.fidelity_scores import family_figures
from lace.local.towers import ImageTowerSplit


def _images(encoder, world: Path, names: list[str]) -> torch.Tensor:
    return torch.stack([encoder.preprocess(Image.open(world / name).convert("RGB")) for name in names])


def benchmark_items(world: Path, split: str, family: str, n_items: int) -> list[dict]:
    """The first `n_items` items of `family` (swap_attribute, replace_attribute, ...) in the world's benchmark
    `split`."""
    items = read_json(Path(world) / "benchmarks" / f"{split}.json", list)
    return [item for item in items if item["family"] == family][:n_items]


def item_pixels(encoder, world: Path, items: list[dict]) -> dict[str, torch.Tensor]:
    """"x" and "x_rendered" (N, 3, H, W): the items' images and rendered negatives in the model's input format."""
    return {"x": _images(encoder, Path(world), [item["filename"] for item in items]),
            "x_rendered": _images(encoder, Path(world), [item["negative_filename"] for item in items])}


def family_data(encoder, pixels: dict[str, torch.Tensor], items: list[dict]) -> dict[str, torch.Tensor]:
    """The items' `pixels` (`item_pixels`) with the unit embeddings (N, d) the figures compare: "u" and
    "u_rendered" of the images, "v_pos" and "v_neg" of their captions."""
    return {**pixels, "u": encoder.encode_images(pixels["x"]), "u_rendered": encoder.encode_images(pixels["x_rendered"]),
            "v_pos": encoder.encode_texts([item["caption"] for item in items]),
            "v_neg": encoder.encode_texts([item["negative_caption"] for item in items])}


def edit_figures(split: ImageTowerSplit, features: torch.Tensor, step: torch.Tensor, valid: torch.Tensor,
                 data: dict[str, torch.Tensor], generator: torch.Generator) -> dict:
    """The figures (`family_figures`) of local edits made at `split`'s layer on the region features (N, P, C) of
    data["x"] (`family_data`): steps (N, P, C), valid (N,), beside the same-size random step at the same positions
    (drawn from `generator`)."""
    control = random_control(step, generator)
    u_edit = split.upper(features + step)
    u_control = split.upper(features + control)
    return family_figures(data, valid, u_edit, u_control, step.flatten(1).norm(dim=1))


def swap_fidelity(clip: torch.nn.Module, editor: LocalImageEditor, data: dict[str, torch.Tensor],
                  generator: torch.Generator) -> dict:
    """The figures (`edit_figures`) of a fitted editor's binding swaps of `swap_attribute` items (`family_data`),
    the objects found by its reader: `edit.direction_agreement` is the mean cos(u_edit - u, u_rendered - u) over
    the rows with a valid swap (`valid_share`). clip: the open_clip model the editor edits, on data's device."""
    split = ImageTowerSplit(clip, editor.layer)
    features = split.regions(split.lower(data["x"]))
    objects = editor.locate(clip, data["x"], features, split.grid)
    step, valid = binding_swap(editor.transport, features, split.grid, objects)
    return edit_figures(split, features, step, valid, data, generator)
