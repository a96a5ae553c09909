"""What the inspect panel shows: a query's active atoms and the edits its code allows.

A query is a dataset image (by id), a dataset caption (by id) or a typed caption. The bars are the
query's non-zero codes, each labelled with its atom's concept; the edits offered are those the editor's
planner proposes on the query: a source must own an aligned atom and be present, a swap target must be a
present concept of the same type (with weights apart), a transplant target an absent one of the same type,
a rebind target another present attribute of the same group, the two bound to different objects (only
when the dictionary has binding directions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lace.edits import EditSpec
from lace.edits.editor import CounterfactualEditor
from lace.errors import input_error
from lace.explore.state import ExploreSession, ModelView


@dataclass
class Query:
    """One embedding to inspect or edit: z (1, d) unit, its modality, and the dataset rows it came from."""

    z: torch.Tensor
    modality: str
    label: str
    image: int | None = None
    caption_id: int | None = None


def resolve_query(session: ExploreSession, view: ModelView, image: int | None, caption_id: int | None,
                  caption: str | None) -> Query:
    """The query named by exactly one of an image id, a caption id or a typed caption."""
    given = [name for name, value in (("image", image), ("caption_id", caption_id), ("caption", caption))
             if value is not None]
    if len(given) != 1:
        raise input_error("request", "image / caption_id / caption", "exactly one of an image id, a caption id "
                          "or a typed caption", ", ".join(given) or "none")
    if image is not None:
        session.check_image(image)
        return Query(view.image_embeddings[image: image + 1], "image", session.dataset.records[image].captions[0],
                     image=image)
    if caption_id is not None:
        session.check_caption_row(caption_id)
        return Query(view.text_embeddings[caption_id: caption_id + 1], "text", session.captions[caption_id],
                     caption_id=caption_id)
    text = caption.strip()
    if not text:
        raise input_error("request", "caption", "a caption with at least one word", caption)
    if view.encoder is None:
        raise input_error("request", "caption", f"a dataset caption ('{view.name}' has no text encoder here)", text)
    with torch.no_grad():
        z = view.encoder.encode_texts([text]).float().cpu()
    return Query(z, "text", text)


def query_codes(view: ModelView, query: Query) -> torch.Tensor:
    """(K,) dense code of the query (a stored row when the query is one of the dataset's)."""
    stored = query.image if query.modality == "image" else query.caption_id
    if stored is not None:
        return view.codes(query.modality)[stored]
    return view.labelled.dictionary.transform(query.z, query.modality, dense=True)[0]


def atom_bars(view: ModelView, codes: torch.Tensor) -> list[dict]:
    """The active atoms of (K,) `codes`, heaviest first: atom, concept, kind, group, weight, aligned, editable."""
    labelled = view.labelled
    directions, labelling = labelled.directions, labelled.labelling
    _, editable, _ = view.weights_and_editable(codes[None])
    aligned = labelling.aligned()
    bars = []
    for atom in torch.nonzero(codes > 0).squeeze(1).tolist():
        concept = int(labelling.atom_concept[atom])
        bars.append({
            "atom": atom, "concept": directions.names[concept], "kind": directions.kinds[concept],
            "group": directions.groups[concept], "weight": float(codes[atom]), "aligned": bool(aligned[atom]),
            "editable": bool(aligned[atom]) and bool(editable[0, concept]),
        })
    return sorted(bars, key=lambda bar: -bar["weight"])


def edit_options(view: ModelView, query: Query, codes: torch.Tensor) -> list[dict]:
    """Per concept the query uses (weight > 0) that owns an aligned atom: each edit kind the editor would make
    on it, with its targets (same type; present for swap and rebind, absent for transplant; none for attenuate)."""
    directions = view.labelled.directions
    weights, editable, compatible = view.weights_and_editable(codes[None])
    weights, editable = weights[0], editable[0]
    present = weights > 0
    editor = view.editor(1.0)
    options = []
    for concept in torch.nonzero(present & compatible.any(1)).squeeze(1).tolist():
        same_type = compatible[concept]
        candidates = {"attenuate": [None], "swap": _names(directions, same_type & present),
                      "transplant": _names(directions, same_type & ~present),
                      "rebind": _names(directions, same_type & present)
                      if editor.can_rebind and directions.kinds[concept] == "attribute" else []}
        source = directions.names[concept]
        kinds = {kind: [target for target in targets if _proposed(editor, query, EditSpec(kind, source, target))]
                 for kind, targets in candidates.items()}
        kinds = {kind: [t for t in targets if t is not None] for kind, targets in kinds.items() if targets}
        options.append({"concept": source, "kind": directions.kinds[concept], "group": directions.groups[concept],
                        "weight": float(weights[concept]), "editable": bool(editable[concept]), "targets": kinds})
    return sorted(options, key=lambda option: -option["weight"])


def _proposed(editor: CounterfactualEditor, query: Query, spec: EditSpec) -> bool:
    """Whether the planner finds the named edit feasible on the query (the effect check aside)."""
    return bool(editor.apply(query.z, query.modality, spec).records.proposed[0, 0])


def _names(directions, mask: torch.Tensor) -> list[str]:
    return [directions.names[i] for i in torch.nonzero(mask).squeeze(1).tolist()]


def inspect_payload(session: ExploreSession, view: ModelView, query: Query) -> dict:
    """What the inspect panel draws for `query`."""
    payload = {"label": query.label, "modality": query.modality, "image": query.image,
               "caption_id": query.caption_id, "model": view.name, "has_dictionary": view.labelled is not None}
    if view.labelled is not None:
        codes = query_codes(view, query)
        payload["bars"] = atom_bars(view, codes)
        payload["options"] = edit_options(view, query, codes)
    return payload
