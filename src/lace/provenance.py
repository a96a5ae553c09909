"""Provenance figures: can a model tell an edited image from a real one by how it was made?

An image-side negative u' (an edited image) that the model rejects for its provenance, not for what it
shows, teaches nothing about binding. With u, v the real image and its caption and u', v' the edited
image and the caption that describes the edit (all unit vectors, rows paired):

- `real_image_prefers_its_caption`: s(u, v) > s(u, v');
- `edited_image_prefers_edited_caption`: s(u', v') > s(u', v);
- `real_caption_prefers_real_image`: s(v, u) > s(v, u');
- `edited_caption_prefers_edited_image`: s(v', u') > s(v', u); at about 0 the model prefers real images
  whatever they show (the provenance shortcut), at 1 it reads the edit;
- `edit_cosine`: the mean cos(u, u').

`real_vs_edited_auc` is a held-out linear probe on pooled embeddings: 0.5 when real and edited images are
indistinguishable, 1 when provenance alone separates them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

PREFERENCES = ("real_image_prefers_its_caption", "edited_image_prefers_edited_caption",
               "real_caption_prefers_real_image", "edited_caption_prefers_edited_image")


def provenance_preferences(u: Tensor, v: Tensor, u_edit: Tensor, v_edit: Tensor,
                           valid: Tensor | None = None) -> dict[str, float]:
    """The four preferences and the mean cos(u, u') over the rows (B,) where `valid` (default: all).

    u, v, u_edit, v_edit: (B, d) unit embeddings of the real image, its caption, the edited image and the caption
    that describes the edit. Ties count as no preference.
    """
    if not (u.shape == v.shape == u_edit.shape == v_edit.shape) or u.ndim != 2:
        raise ValueError(f"expected four (B, d) tensors of one shape, got {[tuple(t.shape) for t in (u, v, u_edit, v_edit)]}")
    rows = torch.ones(u.shape[0], dtype=torch.bool) if valid is None else valid.bool().cpu()
    u, v, u_edit, v_edit = (t.detach().float().cpu()[rows] for t in (u, v, u_edit, v_edit))
    if not len(u):
        return {**{name: float("nan") for name in PREFERENCES}, "edit_cosine": float("nan"), "n": 0}

    def score(a: Tensor, b: Tensor) -> Tensor:
        return (a * b).sum(-1)

    figures = {
        "real_image_prefers_its_caption": score(u, v) > score(u, v_edit),
        "edited_image_prefers_edited_caption": score(u_edit, v_edit) > score(u_edit, v),
        "real_caption_prefers_real_image": score(v, u) > score(v, u_edit),
        "edited_caption_prefers_edited_image": score(v_edit, u_edit) > score(v_edit, u),
    }
    result = {name: float(won.float().mean()) for name, won in figures.items()}
    return {**result, "edit_cosine": float(score(u, u_edit).mean()), "n": len(u)}


def rank_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of `scores` (N,) for binary `labels` (N,), by the Mann-Whitney rank sum (ties
    share their mean rank)."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        raise ValueError("labels: expected both classes")
    # imported here, not above: scipy.stats costs every `lace train` about a second of start-up
    from scipy.stats import rankdata

    ranks = rankdata(scores)  # 1-based, the mean rank over each run of tied scores
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def real_vs_edited_auc(train_real: Tensor, train_edited: Tensor, test_real: Tensor, test_edited: Tensor,
                       steps: int = 300, weight_decay: float = 1e-3, seed: int = 0) -> float:
    """Held-out AUC of a logistic-regression probe telling edited (N, d) embeddings from real ones.

    Fitted by full-batch L-BFGS on the train rows (features standardised on them), scored on the test rows;
    the two sets should hold different images.
    """
    features = torch.cat([train_real, train_edited]).detach().double().cpu()
    labels = torch.cat([torch.zeros(len(train_real)), torch.ones(len(train_edited))]).double()
    mean, std = features.mean(0), features.std(0).clamp_min(1e-8)
    x = (features - mean) / std
    generator = torch.Generator().manual_seed(seed)
    weight = (0.01 * torch.randn(x.shape[1], generator=generator, dtype=torch.float64)).requires_grad_(True)
    bias = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ weight + bias, labels)
        loss = loss + weight_decay * weight.pow(2).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    test = (torch.cat([test_real, test_edited]).detach().double().cpu() - mean) / std
    with torch.no_grad():
        scores = (test @ weight + bias).numpy()
    return rank_auc(scores, np.r_[np.zeros(len(test_real)), np.ones(len(test_edited))])


__all__ = ["PREFERENCES", "provenance_preferences", "rank_auc", "real_vs_edited_auc"]
