"""Contrastive losses as pure functions: the plain CLIP loss and the LACE loss.

`U` (B, d) and `V` (B, d) are unit image and text embeddings of B matching pairs;
`logit_scale` is the temperature already exponentiated (`s = logit_scale.exp()`, what
`DualEncoder.forward` returns), as in open_clip's `ClipLoss`.

The LACE loss appends hard negatives to the rows of the two logit matrices:
- image->text row i: `[s U_i V^T (B), s U_i . caption_negatives_i (M)]` — edited captions
  of caption i are negatives for image i;
- text->image row j: `[s V_j U^T (B), s V_j . image_negatives_j (M)]` — edited images of
  image j are negatives for caption j.
Invalid extra columns are masked to -inf, so a row without a valid edit is exactly its
plain CLIP row.

Data parallel training: each process computes the rows of its own pairs against the
columns of all processes (`gallery_images`, `gallery_texts`, gathered with gradient; the
own pairs sit at `row_offset`). The counterfactual negatives of a pair only ever extend
its own row, so they never leave their process. The mean of the per-process losses is
then exactly the single-process loss of the global batch, and so are its gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _targets(n_rows: int, row_offset: int, device: torch.device) -> Tensor:
    return torch.arange(row_offset, row_offset + n_rows, device=device)


def _extended_logits(
    queries: Tensor, gallery: Tensor, logit_scale: Tensor, negatives: Tensor | None, valid: Tensor | None
) -> Tensor:
    """(B, G) logits against the gallery, with (B, M) masked negative logits appended."""
    logits = logit_scale * queries @ gallery.T  # (B, G)
    if negatives is None:
        return logits
    if negatives.ndim != 3 or negatives.shape[0] != queries.shape[0] or negatives.shape[2] != queries.shape[1]:
        raise ValueError(
            f"negatives must have shape (B, M, d) = ({queries.shape[0]}, M, {queries.shape[1]}), "
            f"got {tuple(negatives.shape)}"
        )
    if valid is None:
        valid = torch.ones(negatives.shape[:2], dtype=torch.bool, device=negatives.device)
    if valid.shape != negatives.shape[:2]:
        raise ValueError(f"valid must have shape {tuple(negatives.shape[:2])}, got {tuple(valid.shape)}")
    # Zero the invalid negatives before the product so that whatever they hold (even NaN)
    # cannot leak into the gradient; their logits are then masked out of the softmax.
    negatives = torch.where(valid.unsqueeze(-1), negatives, torch.zeros((), dtype=negatives.dtype, device=negatives.device))
    extra = logit_scale * torch.einsum("bd,bmd->bm", queries, negatives.to(queries.dtype))  # (B, M)
    extra = extra.masked_fill(~valid, float("-inf"))
    return torch.cat([logits, extra], dim=1)  # (B, G + M)


def clip_loss(
    U: Tensor,
    V: Tensor,
    logit_scale: Tensor,
    *,
    gallery_images: Tensor | None = None,
    gallery_texts: Tensor | None = None,
    row_offset: int = 0,
) -> Tensor:
    """Plain CLIP loss `0.5 * (CE(s U V^T, I) + CE(s V U^T, I))`, open_clip's `ClipLoss`.

    Args:
        U: (B, d) unit image embeddings (the rows this process owns).
        V: (B, d) unit text embeddings, V[i] matches U[i].
        logit_scale: scalar `s` (already exponentiated).
        gallery_images, gallery_texts: (G, d) columns when they are more than the own
            pairs (all processes' embeddings); the own pairs are rows
            `row_offset .. row_offset + B` of the gallery. Default: U and V themselves.
    Returns:
        scalar loss, the mean over rows of both directions.
    """
    return lace_loss(U, V, logit_scale, gallery_images=gallery_images, gallery_texts=gallery_texts,
                     row_offset=row_offset)


def lace_loss(
    U: Tensor,
    V: Tensor,
    logit_scale: Tensor,
    caption_negatives: Tensor | None = None,
    caption_valid: Tensor | None = None,
    image_negatives: Tensor | None = None,
    image_valid: Tensor | None = None,
    weight: float = 1.0,
    *,
    gallery_images: Tensor | None = None,
    gallery_texts: Tensor | None = None,
    row_offset: int = 0,
) -> Tensor:
    """CLIP loss with counterfactual negatives appended to each row.

    Args:
        U, V, logit_scale, gallery_*, row_offset: as in `clip_loss`.
        caption_negatives: (B, M, d) negatives for image->text row i (edits of caption i), or None.
        caption_valid: (B, M) bool, which caption negatives count (None: all).
        image_negatives: (B, M', d) negatives for text->image row j (edits of image j), or None.
        image_valid: (B, M') bool (None: all).
        weight: w in `plain + w * (extended - plain)`; the extended cross-entropy of a row
            is its plain one plus `log(1 + sum_neg exp / sum_batch exp)`, so w scales that
            hard-negative term. w = 1 is one softmax over batch and negatives; w = 0 the
            plain loss.
    Returns:
        scalar loss.
    """
    gallery_images = U if gallery_images is None else gallery_images
    gallery_texts = V if gallery_texts is None else gallery_texts
    targets = _targets(U.shape[0], row_offset, U.device)
    image_to_text = _extended_logits(U, gallery_texts, logit_scale, caption_negatives, caption_valid)
    text_to_image = _extended_logits(V, gallery_images, logit_scale, image_negatives, image_valid)
    extended = 0.5 * (F.cross_entropy(image_to_text, targets) + F.cross_entropy(text_to_image, targets))
    if weight == 1.0 or (caption_negatives is None and image_negatives is None):
        return extended
    n_columns = gallery_texts.shape[0]
    plain = 0.5 * (
        F.cross_entropy(image_to_text[:, :n_columns], targets)
        + F.cross_entropy(text_to_image[:, : gallery_images.shape[0]], targets)
    )
    return plain + weight * (extended - plain)
