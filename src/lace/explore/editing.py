"""What the edit panel shows: one named edit of a query, its random control of the same size, the codes
before and after, the effect check, and the nearest real images and captions of each with the share
naming the edit's concept (the target; the source for attenuate)."""

from __future__ import annotations

import numpy as np
import torch

from lace.edits import parse_edit
from lace.errors import input_error
from lace.eval.neighbours import topk_neighbours
from lace.explore.inspection import Query, atom_bars, query_codes
from lace.explore.state import ExploreSession, ModelView

LISTS = ("before", "after", "random")
NEEDS = {
    "attenuate": "the source concept present",
    "swap": "both concepts present, their weights apart by more than the editor's swap_min_gap",
    "transplant": "the source concept present and the target absent",
    "rebind": "both attributes present, bound to two different objects",
}
"""What the planner asks of a query for each kind of named edit (`lace.edits.planner`)."""


def edit_payload(session: ExploreSession, view: ModelView, query: Query, edit: str, strength: float,
                 seed: int, k: int) -> dict:
    """Apply `edit` ("transplant:a=b") at `strength` to the query and describe the three neighbour lists."""
    spec = parse_edit(edit, where="edit")
    editor = view.editor(strength)
    edited = editor.apply(query.z, query.modality, spec)
    control = editor.apply(query.z, query.modality, spec, control="random",
                           generator=torch.Generator().manual_seed(seed))
    record = edited.records.to_dicts(editor.unit_names)[0]
    if not record["proposed"]:
        raise input_error("edit", "source", f"{NEEDS[spec.kind]} in this {query.modality} for {edit}",
                          f"source weight {record['source_weight_before']:.3f}")
    concept = spec.target or spec.source
    column = session.concept_index(concept)
    queries = torch.cat([query.z, edited.embeddings[:, 0].detach(), control.embeddings[:, 0].detach()])  # (3, d)
    images = _neighbour_lists(queries, view.image_embeddings, query.image, k, session.image_mentions[:, column])
    captions = _neighbour_lists(queries, view.text_embeddings, query.caption_id, k, session.text_mentions[:, column])
    dictionary = view.labelled.dictionary
    after_codes = dictionary.transform(edited.embeddings[:, 0].detach(), query.modality, dense=True)[0]
    random_codes = dictionary.transform(control.embeddings[:, 0].detach(), query.modality, dense=True)[0]
    return {
        "edit": edit, "strength": strength, "concept": concept, "record": record,
        "passed_check": record["passed_check"],
        "cosine_to_original": float((edited.embeddings[0, 0] * query.z[0]).sum()),
        "cosine_random_to_original": float((control.embeddings[0, 0] * query.z[0]).sum()),
        "bars": {"before": atom_bars(view, query_codes(view, query)), "after": atom_bars(view, after_codes),
                 "random": atom_bars(view, random_codes)},
        "images": {name: {"ids": ids, "share": share} for name, (ids, share) in zip(LISTS, images)},
        "captions": {name: {"ids": ids, "texts": [session.captions[i] for i in ids], "share": share}
                     for name, (ids, share) in zip(LISTS, captions)},
    }


def _neighbour_lists(queries: torch.Tensor, gallery: torch.Tensor, exclude: int | None, k: int,
                     names_concept: np.ndarray) -> list[tuple[list[int], float]]:
    """For each of the (Q, d) queries: its k nearest gallery rows (`exclude` left out) and the share of
    them naming the concept."""
    indices = topk_neighbours(queries, gallery, k + 1).indices.tolist()
    lists = []
    for rows in indices:
        kept = [row for row in rows if row != exclude][:k]
        lists.append((kept, float(np.mean(names_concept[kept])) if kept else 0.0))
    return lists
