"""Hubness reduction at inference: image-caption rankings re-scored by CSLS, QB-Norm or DN.

Each fix changes the scores, not the encoder, and each is computed with the same chunked
exact top-k as the plain diagnostics (`lace.eval.neighbours`), so 50k x 50k fits in the
same memory:

- **CSLS** (Conneau et al., ICLR 2018): `2 s(x, y) - r(x) - r(y)`, where r is an item's
  mean similarity to its `csls_k` nearest items of the other modality. The penalties add
  two coordinates to the vectors (`[2x, -r(x), 1] . [y, 1, -r(y)]`), so one pass of
  `cross_neighbours` gives both directions exactly.
- **QB-Norm with the dynamic inverted softmax** (Bogolin et al., CVPR 2022): a query
  whose plain top-1 lies in the activation set (gallery items in the top-`qbnorm_k` of
  some bank query) is ranked by `exp(beta s(q, g)) / sum_b exp(beta s(b, g))` over the
  bank queries b; the other queries keep `s(q, g)`. Ranked here in the log domain,
  `beta s(q, g) - logsumexp_b beta s(b, g)`, which orders each row as the authors'
  `qb_norm` does. Each direction has its own bank (captions for text->image, images
  for image->text), so the two directions are two rankings.
- **DN**, distribution normalisation (Zhou et al., NeurIPS 2023): `(x - w mu_x) . (y - w mu_y)`
  with the means of a small unlabelled sample; w = 0.5 in the paper's formula (the
  authors' retrieval script uses 0.25).

Without a bank, each fix takes its statistics from the evaluated sets themselves
(transductive: classic CSLS, plain inverted softmax, DN with the test means).
Every top-k search may go through FAISS (`KnnOptions`); QB-Norm's normaliser is a sum
over the whole bank, so it stays one exact chunked pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lace.errors import input_error
from lace.eval.neighbours import (
    DEFAULT_CHUNK,
    EXACT,
    KnnOptions,
    Neighbours,
    as_float_tensor,
    cross_neighbours,
    topk_neighbours,
)

RERANKS = ("csls", "qbnorm", "dn")


@dataclass(frozen=True)
class RerankOptions:
    """Which fixes to diagnose (`lace eval --rerank`) and the knobs of the three, with the published defaults."""

    fixes: tuple[str, ...] = ()
    """Hubness fixes to diagnose besides the plain scores, comma-separated: csls, qbnorm, dn (figures rerank/<fix>/...)."""
    csls_k: int = 10
    """Neighbours whose mean similarity is CSLS's penalty r."""
    qbnorm_beta: float = 20.0
    """Inverse temperature of the inverted softmax (the authors' default 20)."""
    qbnorm_k: int = 1
    """Activation set: gallery items in the top-k of some bank query (the authors' default 1)."""
    dn_weight: float = 0.5
    """Share of the sample mean DN subtracts from each side (0.5 in the paper's formula)."""

    def __post_init__(self):
        unknown = [name for name in self.fixes if name not in RERANKS]
        if unknown:
            raise input_error("rerank options", "rerank", f"some of {list(RERANKS)} (--rerank)", unknown)
        for name in ("csls_k", "qbnorm_k"):
            if getattr(self, name) < 1:
                raise input_error("rerank options", name, "an integer >= 1", getattr(self, name))
        if not self.qbnorm_beta > 0:
            raise input_error("rerank options", "qbnorm_beta", "a number > 0", self.qbnorm_beta)


@dataclass
class QueryBank:
    """Unlabelled embeddings the fixes take their statistics from (e.g. training images and captions)."""

    images: torch.Tensor | None = None
    """(B_img, d) unit vectors; None: use the evaluated images."""
    texts: torch.Tensor | None = None
    """(B_txt, d) unit vectors; None: use the evaluated captions."""


def csls_penalty(
    points: torch.Tensor, others: torch.Tensor, k: int, chunk: int = DEFAULT_CHUNK, knn: KnnOptions = EXACT
) -> torch.Tensor:
    """(N,) mean similarity of each of (N, d) `points` to its k nearest rows of (M, d) `others`."""
    return topk_neighbours(points, others, k, chunk=chunk, knn=knn).scores.mean(dim=1)


def log_inverted_softmax_normaliser(
    bank: torch.Tensor, gallery: torch.Tensor, beta: float, chunk: int = DEFAULT_CHUNK
) -> torch.Tensor:
    """(G,) `log sum_b exp(beta s(b, g))` over (B, d) bank rows, for each of (G, d) gallery rows."""
    total = torch.full((gallery.shape[0],), float("-inf"))
    for start in range(0, bank.shape[0], chunk):
        block = beta * (bank[start: start + chunk] @ gallery.T)  # (c, G)
        total = torch.logaddexp(total, torch.logsumexp(block, dim=0))
    return total


def activation_set(
    bank: torch.Tensor, gallery: torch.Tensor, k: int, chunk: int = DEFAULT_CHUNK, knn: KnnOptions = EXACT
) -> torch.Tensor:
    """(G,) bool: gallery rows in the top-k of at least one of the (B, d) bank queries."""
    active = torch.zeros(gallery.shape[0], dtype=torch.bool)
    active[topk_neighbours(bank, gallery, k, chunk=chunk, knn=knn).indices.reshape(-1)] = True
    return active


@torch.no_grad()
def querybank_neighbours(
    queries: np.ndarray | torch.Tensor,
    gallery: np.ndarray | torch.Tensor,
    bank: np.ndarray | torch.Tensor,
    k: int,
    beta: float = 20.0,
    bank_k: int = 1,
    chunk: int = DEFAULT_CHUNK,
    knn: KnnOptions = EXACT,
) -> Neighbours:
    """Top-k of (Q, d) queries among (G, d) gallery rows under QB-Norm's dynamic inverted softmax.

    `bank`: (B, d) queries of the same modality as `queries` (e.g. training captions for
    text->image). Scores of normalised rows are `beta s - logsumexp_b beta s_b`, of the
    others the plain `s`: compare scores within a row only.
    """
    queries, gallery, bank = as_float_tensor(queries), as_float_tensor(gallery), as_float_tensor(bank)
    plain = topk_neighbours(queries, gallery, k, chunk=chunk, knn=knn)
    active = activation_set(bank, gallery, bank_k, chunk=chunk, knn=knn)
    normalise = active[plain.indices[:, 0]]  # (Q,) the dynamic switch: plain top-1 in the activation set
    if not normalise.any():
        return plain
    log_normaliser = log_inverted_softmax_normaliser(bank, gallery, beta, chunk=chunk)  # (G,)
    ones = torch.ones(int(normalise.sum()), 1)
    scaled_queries = torch.cat([beta * queries[normalise], ones], dim=1)  # (Q', d + 1)
    shifted_gallery = torch.cat([gallery, -log_normaliser[:, None]], dim=1)  # (G, d + 1)
    normalised = topk_neighbours(scaled_queries, shifted_gallery, k, chunk=chunk, knn=knn)
    indices, scores = plain.indices.clone(), plain.scores.clone()
    indices[normalise], scores[normalise] = normalised.indices, normalised.scores
    return Neighbours(indices, scores)


@torch.no_grad()
def reranked_neighbours(
    method: str,
    images: np.ndarray | torch.Tensor,
    texts: np.ndarray | torch.Tensor,
    k: int,
    bank: QueryBank | None = None,
    options: RerankOptions = RerankOptions(),
    chunk: int = DEFAULT_CHUNK,
    knn: KnnOptions = EXACT,
) -> tuple[Neighbours, Neighbours]:
    """Top-k captions of each image and top-k images of each caption under a hubness fix.

    Args:
        method: "csls", "qbnorm" or "dn".
        images: (N_img, d) unit vectors.
        texts: (N_txt, d) unit vectors.
        k: neighbours per item in both directions.
        bank: statistics source (default: the evaluated sets themselves).
        knn: how every top-k search is made (exact by default).

    Returns:
        (image_to_text, text_to_image) as `cross_neighbours` returns them: indices
        (N_img, k) caption rows and (N_txt, k) image rows.
    """
    if method not in RERANKS:
        raise ValueError(f"unknown rerank {method!r}; expected one of {RERANKS}")
    images, texts = as_float_tensor(images), as_float_tensor(texts)
    bank = bank or QueryBank()
    bank_images = as_float_tensor(bank.images) if bank.images is not None else images
    bank_texts = as_float_tensor(bank.texts) if bank.texts is not None else texts
    if method == "csls":
        image_penalty = csls_penalty(images, bank_texts, options.csls_k, chunk, knn)  # (N_img,)
        text_penalty = csls_penalty(texts, bank_images, options.csls_k, chunk, knn)  # (N_txt,)
        ones_images, ones_texts = torch.ones(images.shape[0], 1), torch.ones(texts.shape[0], 1)
        lifted_images = torch.cat([2 * images, -image_penalty[:, None], ones_images], dim=1)  # (N_img, d + 2)
        lifted_texts = torch.cat([texts, ones_texts, -text_penalty[:, None]], dim=1)  # (N_txt, d + 2)
        return cross_neighbours(lifted_images, lifted_texts, k, chunk=chunk, knn=knn)
    if method == "dn":
        centred_images = images - options.dn_weight * bank_images.mean(dim=0)
        centred_texts = texts - options.dn_weight * bank_texts.mean(dim=0)
        return cross_neighbours(centred_images, centred_texts, k, chunk=chunk, knn=knn)
    forward = querybank_neighbours(images, texts, bank_images, k, options.qbnorm_beta, options.qbnorm_k, chunk, knn)
    backward = querybank_neighbours(texts, images, bank_texts, k, options.qbnorm_beta, options.qbnorm_k, chunk, knn)
    return forward, backward
