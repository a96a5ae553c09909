"""The edit figure: nearest real images of a source image before an edit, after it, and after a
random edit of the same size, for several sources and strengths, each row with its target count.

Sources are chosen without looking at the outcome: the first images (in store order) whose
captions name the edit's source concept and not its target, and where the editor can make
the edit at the first strength. Each row counts how many of its k neighbours have a caption
naming the target.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lace.concepts.directions import mention_matrix
from lace.concepts.labelled import LabelledDictionary
from lace.concepts.vocabulary import Concept, Vocabulary
from lace.edits import EditConfig, build_editor, parse_edit
from lace.report.plots import image_grid


def images_naming(captions: Sequence[str], text_image_index: Sequence[int] | np.ndarray, n_images: int,
                  concept: str, kind: str) -> np.ndarray:
    """(N_img,) bool: some caption of the image names `concept` (whole words, plurals; `mention_matrix`)."""
    vocabulary = Vocabulary("grid", [Concept(concept, kind, kind)])
    rows, _ = mention_matrix(vocabulary, list(captions))
    shown = np.zeros(n_images, dtype=bool)
    shown[np.asarray(text_image_index, dtype=np.int64)[rows]] = True
    return shown


def _neighbours(query: torch.Tensor, gallery: torch.Tensor, exclude: int, k: int) -> list[int]:
    """The k gallery rows nearest to (d,) `query`, the source image left out."""
    order = torch.argsort(-(gallery @ query), stable=True)[: k + 1]
    return [int(row) for row in order if int(row) != exclude][:k]


def edit_grid_rows(
    labelled: LabelledDictionary,
    gallery: torch.Tensor | np.ndarray,
    candidates: Sequence[int],
    shows_target: np.ndarray,
    edit: str,
    strengths: Sequence[float] = (1.0, 4.0),
    n_sources: int = 4,
    k: int = 6,
    seed: int = 0,
    config: EditConfig | None = None,
) -> list[dict]:
    """Neighbour rows of the edit figure.

    Args:
        labelled: the concept dictionary the edit is made with.
        gallery: (N, d) unit image embeddings (tensor or array); the neighbours are looked up among them.
        candidates: gallery rows eligible as sources, in the order they are taken (e.g. by id).
        shows_target: (N,) bool, the image has a caption naming the edit's target.
        edit: a named edit, e.g. "transplant:square=star".
        strengths: transplant strengths, one transplant row and one random row each.
        n_sources: how many sources (the first candidates where the edit can be made).
        config: the editor's other knobs (default `EditConfig()`); each strength replaces its `strength`.

    Returns:
        One dict per row, grouped by source: `source` (gallery row), `label`, `neighbours`
        (k rows), `target_count` (how many of them show the target), `strength`
        (None for the row before the edit); a source contributes 1 + 2 * len(strengths) rows.
    """
    spec = parse_edit(edit)
    editors = [build_editor(labelled, dataclasses.replace(config or EditConfig(), strength=strength))
               for strength in strengths]
    gallery = torch.as_tensor(np.array(gallery, dtype=np.float32) if isinstance(gallery, np.ndarray) else gallery)
    rows: list[dict] = []
    taken = 0
    for source in candidates:
        if taken == n_sources:
            break
        z = gallery[source: source + 1]  # (1, d)
        edits = [editor.apply(z, "image", spec) for editor in editors]
        if not bool(edits[0].valid[0, 0]):
            continue
        taken += 1

        queries = [("before", z[0], None)]
        for strength, editor, edited in zip(strengths, editors, edits):
            if not bool(edited.valid[0, 0]):
                continue
            generator = torch.Generator().manual_seed(seed + int(source))
            random = editor.apply(z, "image", spec, control="random", generator=generator)
            queries.append((f"{spec.source}->{spec.target} x{strength:g}", edited.embeddings[0, 0], strength))
            queries.append((f"random, same size x{strength:g}", random.embeddings[0, 0], strength))
        for label, query, strength in queries:
            neighbours = _neighbours(query, gallery, int(source), k)
            rows.append({"source": int(source), "label": label, "neighbours": neighbours, "strength": strength,
                         "target_count": int(np.asarray(shows_target)[neighbours].sum())})
    return rows


def write_edit_grid(
    rows: Sequence[dict], load_image: Callable[[int], Image.Image], path: str | Path, target: str, k: int,
    title: str = "",
) -> Path:
    """Draw `edit_grid_rows` output: each row the source image, then its k neighbours; the row's label names the
    source image (`image`, else its row) and its caption (`caption`, where the row has one), the edit, and how many
    of the k neighbours show `target`."""
    grid = []
    for row in rows:
        name = row.get("image", f"image {row['source']}")
        caption = textwrap.shorten(row.get("caption", ""), 60, placeholder="…")
        label = "\n".join([name] + textwrap.wrap(f"“{caption}”", 30) * bool(caption)
                          + [f"{row['label']}: {row['target_count']}/{k} {target}"])
        images = [load_image(row["source"])] + [load_image(i) for i in row["neighbours"]]
        grid.append((label, images, ["source"] + [str(i) for i in range(1, len(row["neighbours"]) + 1)]))
    return image_grid(grid, path, title=title)
