"""The geometry map: every image and caption in 2-D with hubs and one-way neighbours marked, a point's
neighbours both ways with why it is (or is not) a hub, neighbour lists as CSV, and the comparison of
two models on one image. Neighbours are the top-k lists computed at start in chunks (`ModelView`)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from lace.explore.inspection import atom_bars
from lace.explore.state import HUB_SIZE, ExploreSession, ModelView

MODALITIES = ("image", "text")
CSV_BLOCK = 2048
MAP_MAX_POINTS = 20_000
"""Points drawn on the map; the projector freezes on larger sets, and the neighbours come from the server anyway."""


def map_payload(view: ModelView, max_points: int = MAP_MAX_POINTS, seed: int = 0) -> dict:
    """Coordinates with hub and one-way flags, as flat arrays; `item` is each point's row among images then
    captions. Over `max_points` items, every hub is drawn and a seeded sample of the rest fills the budget."""
    hubs = np.concatenate([view.hubs("image"), view.hubs("text")])
    one_way = np.concatenate([view.image_one_way, view.text_one_way])
    items = np.arange(len(hubs))
    if len(items) > max_points:
        others = np.flatnonzero(~hubs)
        room = max(0, max_points - int(hubs.sum()))
        sample = np.random.default_rng(seed).choice(others, size=min(room, len(others)), replace=False)
        items = np.sort(np.concatenate([np.flatnonzero(hubs), sample]))
    return {
        "method": view.map_method, "k": view.k, "n_images": len(view.image_embeddings), "n_items": len(hubs),
        "item": items.tolist(), "x": np.round(view.map_xy[items, 0], 4).tolist(),
        "y": np.round(view.map_xy[items, 1], 4).tolist(),
        "hub": hubs[items].astype(int).tolist(), "one_way": one_way[items].astype(int).tolist(),
    }


def point_payload(session: ExploreSession, view: ModelView, modality: str, row: int) -> dict:
    """A point's top-k of the other modality, the items of the other modality that list it, and its hubness."""
    if modality == "image":
        session.check_image(row)
        forward, scores = view.image_to_text[row].tolist(), view.image_to_text_scores[row].tolist()
        lists, occurrence, one_way = view.text_to_image.numpy(), view.image_occurrence, view.image_one_way
        n_queries, n_items = len(view.text_embeddings), len(view.image_embeddings)
    else:
        session.check_caption_row(row)
        forward, scores = view.text_to_image[row].tolist(), view.text_to_image_scores[row].tolist()
        lists, occurrence, one_way = view.image_to_text.numpy(), view.text_occurrence, view.text_one_way
        n_queries, n_items = len(view.image_embeddings), len(view.text_embeddings)
    reverse = np.flatnonzero((lists == row).any(axis=1)).tolist()
    n_k = int(occurrence[row])
    expected = view.expected_occurrence(modality)
    hub = bool(view.hubs(modality)[row])
    other = "text" if modality == "image" else "image"
    why = (f"{n_k} of the {n_queries} {_plural(other)} list it in their top-{view.k}; the mean over the "
           f"{n_items} {_plural(modality)} is {expected:.1f} and a hub needs at least {HUB_SIZE:g} x the mean "
           f"= {HUB_SIZE * expected:.1f}")
    return {
        "modality": modality, "id": row, "label": _label(session, modality, row), "k": view.k,
        "forward": [{"modality": other, "id": i, "score": s, "label": _label(session, other, i)}
                    for i, s in zip(forward, scores)],
        "reverse": [{"modality": other, "id": i, "label": _label(session, other, i)} for i in reverse],
        "n_k": n_k, "expected_n_k": expected, "hub": bool(hub), "why": why, "one_way": bool(one_way[row]),
    }


def neighbour_csv(session: ExploreSession, view: ModelView, modality: str) -> Iterator[str]:
    """CSV lines of every top-k list from `modality` to the other: query, rank, neighbour, cosine."""
    if modality == "image":
        indices, scores, other = view.image_to_text, view.image_to_text_scores, "text"
    else:
        indices, scores, other = view.text_to_image, view.text_to_image_scores, "image"
    yield "query_modality,query_id,rank,neighbour_modality,neighbour_id,cosine,n_k_of_neighbour\n"
    occurrence = view.text_occurrence if other == "text" else view.image_occurrence
    for start in range(0, len(indices), CSV_BLOCK):
        block, block_scores = indices[start: start + CSV_BLOCK].tolist(), scores[start: start + CSV_BLOCK].tolist()
        lines = []
        for offset, (rows, values) in enumerate(zip(block, block_scores)):
            for rank, (row, score) in enumerate(zip(rows, values), 1):
                lines.append(f"{modality},{start + offset},{rank},{other},{row},{score:.6f},{occurrence[row]}\n")
        yield "".join(lines)


def compare_payload(session: ExploreSession, image: int) -> dict:
    """One image under every model: its code bars, its nearest captions and its hub score."""
    session.check_image(image)
    models = []
    for view in session.models:
        captions = view.image_to_text[image].tolist()
        models.append({
            "name": view.name, "bars": atom_bars(view, view.image_codes[image]) if view.labelled is not None else None,
            "captions": [{"id": i, "text": session.captions[i], "own": bool(session.text_image_index[i] == image)}
                         for i in captions],
            "n_k": int(view.image_occurrence[image]), "hub": bool(view.hubs("image")[image]),
            "one_way": bool(view.image_one_way[image]), "k": view.k,
        })
    return {"image": image, "caption": session.dataset.records[image].captions[0], "models": models}


def _label(session: ExploreSession, modality: str, row: int) -> str:
    return session.dataset.records[row].captions[0] if modality == "image" else session.captions[row]


def _plural(modality: str) -> str:
    return "images" if modality == "image" else "captions"
