"""Contrastive losses as pure functions: the plain CLIP loss, the LACE loss and SigLIP's sigmoid loss.

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

Edge cases, decided:
- Shapes are checked: U and V must be (B, d) with B >= 1 and the same d, the galleries (G, d)
  with the own rows inside them; anything else is a `LaceInputError` naming the argument.
  An empty batch has no contrastive loss (open_clip returns NaN there) and is refused.
- A single pair (B = 1) has a plain CLIP loss of exactly 0 and no gradient: its only
  column is its own match. Its counterfactual negatives still give a positive loss.
- NaN or inf in U, V or the scale propagate into the loss, as in open_clip and in
  `F.cross_entropy`; the loss does not read values back (that would stall the GPU every
  step). The trainer checks the loss it logs and stops before writing a checkpoint from a
  diverged model. Invalid negatives may hold anything, NaN included: they never reach
  the loss or its gradient.
- Duplicates: when two pairs of a batch share an image or a caption (five captions per
  Flickr8k image), the other copy is a false negative. By default it stays a negative,
  exactly as open_clip's `ClipLoss` treats it (its targets are `arange(B)`, nothing is
  masked). Pass `false_negatives` (B, G) to take such columns out of both softmaxes;
  `duplicate_pairs` builds it from image and caption keys.

Data parallel training: each process computes the rows of its own pairs against the
columns of all processes (`gallery_images`, `gallery_texts`, gathered with gradient; the
own pairs sit at `row_offset`). The counterfactual negatives of a pair only ever extend
its own row, so they never leave their process. The mean of the per-process losses is
then exactly the single-process loss of the global batch, and so are its gradients.

The sigmoid loss (`sigmoid_loss`, SigLIP's, open_clip's `SigLipLoss`) takes the same arguments plus
the learned `logit_bias` b: one binary term `-log sigmoid(z (s u.v + b))` per image-caption pair,
z = +1 for a match and -1 otherwise, summed and divided by the batch size. A counterfactual negative
is one more z = -1 term, in the row it belongs to; nothing is normalised over a row, so a negative
never changes another term. Data parallel: the rows of the own images against every gathered caption
(each pair of the global batch is one term in exactly one process), so the mean over processes is
again the single-process loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lace.errors import input_error


def _targets(n_rows: int, row_offset: int, device: torch.device) -> Tensor:
    return torch.arange(row_offset, row_offset + n_rows, device=device)


def _galleries(U: Tensor, V: Tensor, logit_scale: Tensor, gallery_images: Tensor | None,
               gallery_texts: Tensor | None, row_offset: int, false_negatives: Tensor | None) -> tuple[Tensor, Tensor]:
    """The (G, d) image and text galleries (default: U and V themselves), checked with the other arguments."""
    gallery_images = U if gallery_images is None else gallery_images
    gallery_texts = V if gallery_texts is None else gallery_texts
    if U.ndim != 2 or U.shape[0] < 1:
        raise input_error("contrastive loss", "U", "(B, d) image embeddings with B >= 1", tuple(U.shape))
    if V.shape != U.shape:
        raise input_error("contrastive loss", "V", f"(B, d) = {tuple(U.shape)} text embeddings, like U",
                          tuple(V.shape))
    for name, gallery in (("gallery_images", gallery_images), ("gallery_texts", gallery_texts)):
        if gallery.ndim != 2 or gallery.shape[1] != U.shape[1] or gallery.shape[0] < row_offset + U.shape[0]:
            raise input_error("contrastive loss", name, f"(G, {U.shape[1]}) with the own rows at "
                              f"{row_offset}..{row_offset + U.shape[0] - 1}", tuple(gallery.shape))
    if row_offset < 0:
        raise input_error("contrastive loss", "row_offset", "a non-negative row", row_offset)
    if torch.as_tensor(logit_scale).numel() != 1:
        raise input_error("contrastive loss", "logit_scale", "a scalar", tuple(torch.as_tensor(logit_scale).shape))
    if false_negatives is not None and (false_negatives.shape != (U.shape[0], gallery_texts.shape[0])
                                        or gallery_images.shape[0] != gallery_texts.shape[0]):
        raise input_error("contrastive loss", "false_negatives", f"a (B, G) = ({U.shape[0]}, "
                          f"{gallery_texts.shape[0]}) bool mask", tuple(false_negatives.shape))
    return gallery_images, gallery_texts


def duplicate_pairs(image_keys: Tensor, caption_keys: Tensor, gallery_image_keys: Tensor | None = None,
                    gallery_caption_keys: Tensor | None = None, row_offset: int = 0) -> Tensor:
    """(B, G) bool: column g is another pair with row i's image or caption (a false negative of row i).

    Keys are integer ids, (B,) for the own rows and (G,) for the gallery (default: the own rows);
    equal ids mean the same image (or the same caption text). A row's own column is never marked.
    """
    gallery_image_keys = image_keys if gallery_image_keys is None else gallery_image_keys
    gallery_caption_keys = caption_keys if gallery_caption_keys is None else gallery_caption_keys
    shared = (image_keys[:, None] == gallery_image_keys[None, :]) | (caption_keys[:, None] == gallery_caption_keys[None, :])
    own = _targets(image_keys.shape[0], row_offset, image_keys.device)
    shared[torch.arange(image_keys.shape[0], device=image_keys.device), own] = False
    return shared


def _negative_logits(queries: Tensor, negatives: Tensor, valid: Tensor | None,
                     logit_scale: Tensor) -> tuple[Tensor, Tensor]:
    """(B, M) logits `s q.n` of each query's own (B, M, d) negatives, and their (B, M) validity (all valid when
    None). Invalid slots are zeroed before the product, so whatever they hold (even NaN) cannot leak into the
    loss or its gradient; the caller masks their logits."""
    if negatives.ndim != 3 or negatives.shape[0] != queries.shape[0] or negatives.shape[2] != queries.shape[1]:
        raise ValueError(
            f"negatives must have shape (B, M, d) = ({queries.shape[0]}, M, {queries.shape[1]}), "
            f"got {tuple(negatives.shape)}"
        )
    if valid is None:
        valid = torch.ones(negatives.shape[:2], dtype=torch.bool, device=negatives.device)
    if valid.shape != negatives.shape[:2]:
        raise ValueError(f"valid must have shape {tuple(negatives.shape[:2])}, got {tuple(valid.shape)}")
    negatives = torch.where(valid.unsqueeze(-1), negatives, torch.zeros((), dtype=negatives.dtype, device=negatives.device))
    return logit_scale * torch.einsum("bd,bmd->bm", queries, negatives.to(queries.dtype)), valid


def _extended_logits(
    queries: Tensor, gallery: Tensor, logit_scale: Tensor, negatives: Tensor | None, valid: Tensor | None,
    false_negatives: Tensor | None = None,
) -> Tensor:
    """(B, G) logits against the gallery, with (B, M) masked negative logits appended."""
    logits = logit_scale * queries @ gallery.T  # (B, G)
    if false_negatives is not None:
        logits = logits.masked_fill(false_negatives.to(torch.bool), float("-inf"))
    if negatives is None:
        return logits
    extra, valid = _negative_logits(queries, negatives, valid, logit_scale)  # (B, M)
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
    false_negatives: Tensor | None = None,
) -> Tensor:
    """Plain CLIP loss `0.5 * (CE(s U V^T, I) + CE(s V U^T, I))`, open_clip's `ClipLoss`.

    Args:
        U: (B, d) unit image embeddings (the rows this process owns).
        V: (B, d) unit text embeddings, V[i] matches U[i].
        logit_scale: scalar `s` (already exponentiated).
        gallery_images, gallery_texts: (G, d) columns when they are more than the own
            pairs (all processes' embeddings); the own pairs are rows
            `row_offset .. row_offset + B` of the gallery. Default: U and V themselves.
        false_negatives: (B, G) bool, columns to leave out of row i's softmax in both
            directions (other copies of its image or caption, `duplicate_pairs`). Default
            None: every other pair is a negative, as in open_clip.
    Returns:
        scalar loss, the mean over rows of both directions.
    """
    return lace_loss(U, V, logit_scale, gallery_images=gallery_images, gallery_texts=gallery_texts,
                     row_offset=row_offset, false_negatives=false_negatives)


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
    false_negatives: Tensor | None = None,
) -> Tensor:
    """CLIP loss with counterfactual negatives appended to each row.

    Args:
        U, V, logit_scale, gallery_*, row_offset, false_negatives: as in `clip_loss`.
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
    gallery_images, gallery_texts = _galleries(U, V, logit_scale, gallery_images, gallery_texts, row_offset,
                                               false_negatives)
    targets = _targets(U.shape[0], row_offset, U.device)
    if false_negatives is not None:  # a row's own pair is its target, never a false negative
        false_negatives = false_negatives.to(torch.bool).clone()
        false_negatives[torch.arange(U.shape[0], device=U.device), targets] = False
    image_to_text = _extended_logits(U, gallery_texts, logit_scale, caption_negatives, caption_valid, false_negatives)
    text_to_image = _extended_logits(V, gallery_images, logit_scale, image_negatives, image_valid, false_negatives)
    extended = 0.5 * (F.cross_entropy(image_to_text, targets) + F.cross_entropy(text_to_image, targets))
    if weight == 1.0 or (caption_negatives is None and image_negatives is None):
        return extended
    n_columns = gallery_texts.shape[0]
    plain = 0.5 * (
        F.cross_entropy(image_to_text[:, :n_columns], targets)
        + F.cross_entropy(text_to_image[:, : gallery_images.shape[0]], targets)
    )
    return plain + weight * (extended - plain)


def _negative_terms(queries: Tensor, negatives: Tensor | None, valid: Tensor | None, logit_scale: Tensor,
                    logit_bias: Tensor) -> Tensor:
    """Sum over the valid (B, M, d) negatives of `-log sigmoid(-(s q.n + b))`, a scalar (0 without any)."""
    if negatives is None:
        return queries.new_zeros(())
    logits, valid = _negative_logits(queries, negatives, valid, logit_scale)
    logits = logits + logit_bias  # (B, M)
    terms = -F.logsigmoid(-logits)  # (B, M)
    return torch.where(valid, terms, torch.zeros((), dtype=terms.dtype, device=terms.device)).sum()


def _signed_terms(logits: Tensor, targets: Tensor, keep: Tensor | None = None) -> Tensor:
    """SigLIP's per-pair terms `-log sigmoid(z_ig * logits_ig)` of (B, G) biased logits, z = +1 at each row's
    target column `targets[i]` and -1 elsewhere; terms where the (B, G) or (1, G) bool `keep` is False are 0."""
    signs = -torch.ones_like(logits)
    signs[torch.arange(len(targets), device=logits.device), targets] = 1.0
    terms = -F.logsigmoid(signs * logits)  # (B, G)
    if keep is None:
        return terms
    return torch.where(keep, terms, torch.zeros((), dtype=terms.dtype, device=terms.device))


def sigmoid_loss(
    U: Tensor,
    V: Tensor,
    logit_scale: Tensor,
    caption_negatives: Tensor | None = None,
    caption_valid: Tensor | None = None,
    image_negatives: Tensor | None = None,
    image_valid: Tensor | None = None,
    weight: float = 1.0,
    *,
    logit_bias: Tensor,
    gallery_images: Tensor | None = None,
    gallery_texts: Tensor | None = None,
    row_offset: int = 0,
    false_negatives: Tensor | None = None,
) -> Tensor:
    """SigLIP's sigmoid loss, with counterfactual negatives as extra z = -1 terms.

    `plain = -(1/B) sum_{i, g} log sigmoid(z_ig (s U_i . T_g + b))` over the B own image rows i and
    every caption column g of the gallery T, z_ig = +1 where g is row i's own caption
    (`row_offset + i`) and -1 elsewhere: open_clip's `SigLipLoss`. The counterfactual terms are
    `extra = -(1/B) [sum_{i,m} log sigmoid(-(s U_i . caption_negatives_im + b))
                   + sum_{j,m} log sigmoid(-(s V_j . image_negatives_jm + b))]` over the valid slots,
    and the loss is `plain + weight * extra`.

    Args:
        U, V, logit_scale, caption_negatives, caption_valid, image_negatives, image_valid, gallery_*,
            row_offset: as in `lace_loss`. Only `gallery_texts` makes terms (one matrix of images
            against captions, as in SigLIP); `gallery_images` is checked like it, for the same call.
        weight: w on the counterfactual terms; 0 gives the plain sigmoid loss.
        logit_bias: scalar b, the model's learned bias (SigLIP initialises it at -10).
        false_negatives: (B, G) bool, pairs (i, g) whose term is left out (other copies of row i's
            image or caption, `duplicate_pairs`); the own pair is never left out.
    Returns:
        scalar loss.
    """
    gallery_images, gallery_texts = _galleries(U, V, logit_scale, gallery_images, gallery_texts, row_offset,
                                               false_negatives)
    if torch.as_tensor(logit_bias).numel() != 1:
        raise input_error("sigmoid loss", "logit_bias", "a scalar", tuple(torch.as_tensor(logit_bias).shape))
    n_rows, rows = U.shape[0], torch.arange(U.shape[0], device=U.device)
    targets = _targets(n_rows, row_offset, U.device)
    keep = None
    if false_negatives is not None:
        keep = ~false_negatives.to(torch.bool)
        keep[rows, targets] = True
    plain = _signed_terms(logit_scale * U @ gallery_texts.T + logit_bias, targets, keep).sum() / n_rows
    if caption_negatives is None and image_negatives is None:
        return plain
    extra = (_negative_terms(U, caption_negatives, caption_valid, logit_scale, logit_bias)
             + _negative_terms(V, image_negatives, image_valid, logit_scale, logit_bias)) / n_rows
    return plain + weight * extra


def _check_pairs(images: Tensor, captions: Tensor, originals: Tensor, valid: Tensor, gallery_images: Tensor,
                 gallery_texts: Tensor, gallery_valid: Tensor, row_offset: int) -> None:
    if images.ndim != 2 or captions.shape != images.shape or originals.shape != images.shape:
        raise input_error("pair loss", "images / captions / originals", "three (N, d) tensors of one shape",
                          [tuple(t.shape) for t in (images, captions, originals)])
    if valid.shape != images.shape[:1]:
        raise input_error("pair loss", "valid", f"({images.shape[0]},) bool", tuple(valid.shape))
    n_columns = gallery_images.shape[0]
    if gallery_texts.shape != gallery_images.shape or gallery_valid.shape != (n_columns,) \
            or n_columns < row_offset + images.shape[0] or gallery_images.shape[1] != images.shape[1]:
        raise input_error("pair loss", "gallery_images / gallery_texts / gallery_valid",
                          f"(G, {images.shape[1]}), (G, {images.shape[1]}) and (G,) with the own rows at {row_offset}",
                          [tuple(t.shape) for t in (gallery_images, gallery_texts, gallery_valid)])


def pair_loss(
    images: Tensor,
    captions: Tensor,
    originals: Tensor,
    valid: Tensor,
    logit_scale: Tensor,
    *,
    logit_bias: Tensor | None = None,
    gallery_images: Tensor | None = None,
    gallery_texts: Tensor | None = None,
    gallery_valid: Tensor | None = None,
    row_offset: int = 0,
    rows: float | Tensor | None = None,
    real_images: Tensor | None = None,
) -> Tensor:
    """The edited pairs' own contrastive term, TripletCLIP's `negclip(I', T', T)` (arXiv 2411.02545).

    Each valid edited image I'_k is a row whose positive is T'_k, the caption that describes its edit, and whose
    hard negative is T_k, the real caption of the image it was made from; each T'_k is a text->image row over the
    edited images. Softmax (`logit_bias` None): `0.5 * (CE_i2t + CE_t2i)` summed over the valid rows, the i2t row
    `[s I'_k . T'_g for every valid g, s I'_k . T_k]`, the t2i row `[s T'_k . I'_g for every valid g]`. Sigmoid
    (`logit_bias` b, SigLIP's): `-log sigmoid(z (s I'_k . T'_g + b))` over the valid g (z = +1 on the own caption),
    plus `-log sigmoid(-(s I'_k . T_k + b))`, summed. Either sum is divided by `rows`. With `real_images`, the
    described caption T'_k also takes the real image I_k as a hard negative of its text->image row (softmax: one
    more column; sigmoid: one more z = -1 term), so the caption of the edit is taught to prefer the edit.

    Args:
        images, captions, originals: (N, d) unit embeddings of the own edited images, their described captions
            and the real captions they were made from (N = B x slots, flattened).
        valid: (N,) bool, the rows that count (an edit that was made and whose caption could be written).
        gallery_images, gallery_texts, gallery_valid: every process's edited images, described captions and
            validity, (G, d), (G, d), (G,), the own rows at `row_offset` (default: the own rows).
        rows: the divisor: the valid rows of the whole global batch over the number of processes (default: the own
            valid rows). The mean of the processes' terms is then the one-process term of the global batch.
        real_images: (N, d) the real image each edit was made from (None: TripletCLIP's layout, no such column).
    Returns:
        scalar; 0 (with a graph) when no row is valid.
    """
    gallery_images = images if gallery_images is None else gallery_images
    gallery_texts = captions if gallery_texts is None else gallery_texts
    gallery_valid = valid if gallery_valid is None else gallery_valid
    valid, gallery_valid = valid.to(torch.bool), gallery_valid.to(torch.bool)
    _check_pairs(images, captions, originals, valid, gallery_images, gallery_texts, gallery_valid, row_offset)
    rows = valid.sum() if rows is None else rows
    own = valid.nonzero().squeeze(1)  # (N_valid,)
    if not len(own):
        return (images.sum() + captions.sum()) * 0.0
    edited, described = images[own], captions[own]
    hard = logit_scale * (edited * originals[own]).sum(-1, keepdim=True)  # (N_valid, 1)
    hard_image = None if real_images is None else logit_scale * (described * real_images[own]).sum(-1, keepdim=True)
    to_texts = logit_scale * edited @ gallery_texts.T  # (N_valid, G)
    if logit_bias is not None:
        return _pair_sigmoid_terms(to_texts, hard, hard_image, own + row_offset, gallery_valid, logit_bias) / rows
    to_images = logit_scale * described @ gallery_images.T  # (N_valid, G)
    return _pair_softmax_terms(to_texts, to_images, hard, hard_image, own + row_offset, gallery_valid) / rows


def _pair_sigmoid_terms(to_texts: Tensor, hard: Tensor, hard_image: Tensor | None, targets: Tensor,
                        gallery_valid: Tensor, logit_bias: Tensor) -> Tensor:
    """`pair_loss`'s sigmoid sum from the (N_valid, G) edited-image logits, the (N_valid, 1) hard negatives
    (and those of the real images, or None), each row's target column and the (G,) valid columns."""
    total = (_signed_terms(to_texts + logit_bias, targets, gallery_valid[None]).sum()
             - F.logsigmoid(-(hard + logit_bias)).sum())
    if hard_image is not None:
        total = total - F.logsigmoid(-(hard_image + logit_bias)).sum()
    return total


def _pair_softmax_terms(to_texts: Tensor, to_images: Tensor, hard: Tensor, hard_image: Tensor | None,
                        targets: Tensor, gallery_valid: Tensor) -> Tensor:
    """`pair_loss`'s softmax sum `0.5 * (CE_i2t + CE_t2i)` from the (N_valid, G) logits both ways, as
    `_pair_sigmoid_terms` takes them."""
    to_texts = to_texts.masked_fill(~gallery_valid[None], float("-inf"))
    to_images = to_images.masked_fill(~gallery_valid[None], float("-inf"))
    if hard_image is not None:
        to_images = torch.cat([to_images, hard_image], dim=1)
    image_to_text = F.cross_entropy(torch.cat([to_texts, hard], dim=1), targets, reduction="sum")
    text_to_image = F.cross_entropy(to_images, targets, reduction="sum")
    return 0.5 * (image_to_text + text_to_image)
