"""The figures of one family of fidelity rows, shared by the local and the pooled-embedding edits.

Every embedding here is a unit vector (N, d): u the image, u_rendered the rendered counterfactual
image, v_pos / v_neg the item's caption and negative caption, u_edit / u_control the edited image
and its random control. Figures are means over the valid rows; invalid rows only count in
`valid_share`.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def mean_or_none(values: Tensor) -> float | None:
    """Mean of (N,) values as a float, None when there are no rows."""
    return float(values.float().mean()) if len(values) else None


def prefers_edited_caption(u: Tensor, v_pos: Tensor, v_neg: Tensor) -> Tensor:
    """(N,) bool: the image u (N, d) is closer to the negative caption than to the positive one."""
    return (u * v_neg).sum(-1) > (u * v_pos).sum(-1)


def edit_scores(u: Tensor, u_edit: Tensor, u_rendered: Tensor, v_pos: Tensor, v_neg: Tensor) -> dict:
    """Per-row figures (N,) -> their means over the rows."""
    agreement = F.cosine_similarity(u_edit - u, u_rendered - u, dim=-1)
    return {
        "direction_agreement": mean_or_none(agreement),
        "direction_agreement_se": float(agreement.std() / len(agreement) ** 0.5) if len(agreement) > 1 else None,
        "cos_edit_rendered": mean_or_none((u_edit * u_rendered).sum(-1)),
        "prefers_edited_caption": mean_or_none(prefers_edited_caption(u_edit, v_pos, v_neg)),
    }


def family_figures(embeddings: dict[str, Tensor], valid: Tensor, u_edit: Tensor, u_control: Tensor,
                   step_norm: Tensor) -> dict:
    """The fidelity figures of one family's edits.

    embeddings: "u", "u_rendered", "v_pos", "v_neg", each (N, d); valid (N,) bool; u_edit and
    u_control (N, d); step_norm (N,) the size of each edit's step (in the space it was made in).
    """
    u, u_rendered = embeddings["u"][valid], embeddings["u_rendered"][valid]
    v_pos, v_neg = embeddings["v_pos"][valid], embeddings["v_neg"][valid]
    return {
        "n": len(valid),
        "valid_share": mean_or_none(valid),
        "edit": edit_scores(u, u_edit[valid], u_rendered, v_pos, v_neg),
        "random_control": edit_scores(u, u_control[valid], u_rendered, v_pos, v_neg),
        "original": {"cos_original_rendered": mean_or_none((u * u_rendered).sum(-1)),
                     "prefers_edited_caption": mean_or_none(prefers_edited_caption(u, v_pos, v_neg))},
        "rendered_prefers_edited_caption": mean_or_none(prefers_edited_caption(u_rendered, v_pos, v_neg)),
        "step_norm": mean_or_none(step_norm[valid]),
    }

