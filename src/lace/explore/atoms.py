"""An atom's page, as sparse-feature dashboards draw one: its label, type and alignment, how often each
modality uses it, the histogram of its non-zero codes, the images and captions that use it most, and
the concept directions closest to it."""

from __future__ import annotations

import numpy as np
import torch

from lace.errors import input_error
from lace.explore.state import ExploreSession, ModelView

HISTOGRAM_BINS = 20
TOP_ITEMS = 8
CLOSEST_CONCEPTS = 6


def atom_payload(session: ExploreSession, view: ModelView, atom: int) -> dict:
    """Everything the atom page shows for atom `atom` of `view`'s dictionary."""
    if view.labelled is None:
        raise input_error("request", "model", f"a model with a dictionary ('{view.name}' has none)")
    labelled = view.labelled
    n_atoms = labelled.dictionary.atoms_.shape[0]
    if not 0 <= atom < n_atoms:
        raise input_error("request", "atom", f"an atom id in 0..{n_atoms - 1}", atom)
    directions, labelling = labelled.directions, labelled.labelling
    concept = int(labelling.atom_concept[atom])
    vector = labelled.dictionary.atoms_[atom].float()
    cosines = directions.directions.float() @ (vector / vector.norm().clamp_min(1e-12))  # (C,)
    closest = torch.argsort(cosines, descending=True)[:CLOSEST_CONCEPTS].tolist()
    image_codes, text_codes = view.image_codes[:, atom], view.text_codes[:, atom]
    top_images = _top_rows(image_codes)
    top_captions = _top_rows(text_codes)
    return {
        "atom": atom, "n_atoms": n_atoms, "concept": directions.names[concept], "kind": directions.kinds[concept],
        "group": directions.groups[concept], "alignment": float(labelling.atom_alignment[atom]),
        "tau_align": float(labelling.tau_align), "aligned": bool(labelling.aligned()[atom]),
        "usage": {"image": float((image_codes > 0).float().mean()), "text": float((text_codes > 0).float().mean())},
        "histogram": _histogram(image_codes, text_codes),
        "top_images": [{"id": row, "code": float(image_codes[row]), "caption": session.dataset.records[row].captions[0]}
                       for row in top_images],
        "top_captions": [{"id": row, "code": float(text_codes[row]), "text": session.captions[row]}
                         for row in top_captions],
        "closest_concepts": [{"concept": directions.names[c], "kind": directions.kinds[c],
                              "cosine": float(cosines[c])} for c in closest],
    }


def _top_rows(codes: torch.Tensor) -> list[int]:
    """Rows with the largest positive codes, at most TOP_ITEMS."""
    order = torch.argsort(codes, descending=True)[:TOP_ITEMS]
    return [int(row) for row in order if codes[row] > 0]


def _histogram(image_codes: torch.Tensor, text_codes: torch.Tensor) -> dict:
    """Counts of the non-zero codes of each modality over shared bins from 0 to the largest code."""
    active = torch.cat([image_codes[image_codes > 0], text_codes[text_codes > 0]])
    top = float(active.max()) if active.numel() else 1.0
    edges = np.linspace(0.0, top, HISTOGRAM_BINS + 1)
    counts = {name: np.histogram(codes[codes > 0].numpy(), bins=edges)[0].tolist()
              for name, codes in (("image", image_codes), ("text", text_codes))}
    return {"edges": edges.tolist(), **counts}
