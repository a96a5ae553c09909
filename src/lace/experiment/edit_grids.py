"""The edit-grid stage: the seed's neighbour figure for one transplant, drawn and recorded.

Sources are the first images (gallery order) whose captions name the edit's source and not its
target, taken without looking at the outcome (`lace.report.edit_grid`); every row's target count
is returned so a report reads its numbers from results, not from the picture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lace.concepts.labelled import LabelledDictionary
from lace.edits import EditConfig, parse_edit
from lace.report.edit_grid import edit_grid_rows, images_naming, write_edit_grid


def edit_grid_stage(
    labelled: LabelledDictionary, gallery: torch.Tensor | np.ndarray, captions: Sequence[str],
    text_image_index: Sequence[int] | np.ndarray, edit: str, load_image: Callable[[int], Image.Image], png: str | Path,
    strengths: Sequence[float], n_sources: int = 4, k: int = 6, seed: int = 0, config: EditConfig | None = None,
    image_names: Sequence[str] | None = None,
) -> dict:
    """Draw the grid of `edit` ("transplant:a=b") over (N, d) `gallery` into `png`.

    Returns {"edit", "target", "k", "strengths", "candidates", "figure" (png name or None), "rows"}; each row
    as `edit_grid_rows` gives it (source, label, neighbours, strength, target_count) with the source's `image`
    (its name in `image_names`, else "image <row>") and `caption` (its first caption). No row: the edit could not
    be made on any candidate, and no figure is written.
    """
    spec = parse_edit(edit)
    directions = labelled.directions
    kinds = {name: directions.kinds[directions.index(name)] for name in (spec.source, spec.target)}
    n_images = len(gallery)
    shows_source = images_naming(captions, text_image_index, n_images, spec.source, kinds[spec.source])
    shows_target = images_naming(captions, text_image_index, n_images, spec.target, kinds[spec.target])
    candidates = np.flatnonzero(shows_source & ~shows_target).tolist()
    rows = edit_grid_rows(labelled, gallery, candidates, shows_target, edit, strengths=strengths,
                          n_sources=n_sources, k=k, seed=seed, config=config)
    first_caption = {}
    for caption, owner in zip(captions, np.asarray(text_image_index).tolist()):
        first_caption.setdefault(int(owner), caption)
    for row in rows:
        row["image"] = image_names[row["source"]] if image_names is not None else f"image {row['source']}"
        row["caption"] = first_caption.get(row["source"], "")
    figure = None
    if rows:
        sources = len({row["source"] for row in rows})
        figure = write_edit_grid(rows, load_image, png, target=spec.target, k=k,
                                 title=f"{edit}: nearest real images of the first {sources} images naming "
                                       f"'{spec.source}' and not '{spec.target}'").name
    return {"edit": edit, "target": spec.target, "k": k, "strengths": [float(s) for s in strengths],
            "candidates": len(candidates), "figure": figure, "rows": rows}
