"""How often edits do what they say, and whether they move an embedding to a different real item."""

from __future__ import annotations

import torch
from torch import Tensor

from lace.edits.editor import CounterfactualEditor
from lace.edits.records import EDIT_KINDS


def edit_report(
    editor: CounterfactualEditor,
    z: Tensor,
    modality: str,
    gallery: Tensor,
    n_edits: int = 4,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Per edit kind: proposed count, share passing the effect check, share whose nearest
    gallery item changes, and the same share for the random control of the same size.

    z: (B, d) unit embeddings of `modality`; gallery: (G, d) unit embeddings of real
    items to look up (e.g. the other modality, or the same one).
    """
    with torch.no_grad():
        edits = editor.counterfactuals(z, modality, n_edits, torch.Generator().manual_seed(seed))
        control = editor.random_control(z, modality, n_edits, torch.Generator().manual_seed(seed))
        gallery = gallery.to(z.device, z.dtype)
        nearest_before = (z @ gallery.T).argmax(-1).unsqueeze(1)  # (B, 1)
        nearest_after = (edits.embeddings @ gallery.T).argmax(-1)  # (B, M)
        nearest_control = (control.embeddings @ gallery.T).argmax(-1)
    records = edits.records
    report = {}
    for index, kind in enumerate(EDIT_KINDS):
        proposed = records.proposed & (records.kind == index)
        valid = edits.valid & (records.kind == index)
        n_proposed, n_valid = int(proposed.sum()), int(valid.sum())
        report[kind] = {
            "proposed": n_proposed,
            "passed_check_share": float(records.passed_check[proposed].float().mean()) if n_proposed else float("nan"),
            "nearest_changed_share": float((nearest_after != nearest_before)[valid].float().mean()) if n_valid else float("nan"),
            "random_nearest_changed_share": float((nearest_control != nearest_before)[valid].float().mean()) if n_valid else float("nan"),
            "mean_step_size": float(records.step_size[valid].mean()) if n_valid else float("nan"),
        }
    return report
