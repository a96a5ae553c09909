"""Geometry of a shared space: retrieval, hubness, one-way neighbours, mutual k-NN.

All figures come from one chunked pass over the image x caption similarities
(`cross_neighbours`); each metric is index arithmetic on the top-k lists. Chance levels
depend on the sizes and on several captions per image, so the one-way and mutual
figures are repeated on isotropic random unit vectors of the same sizes and structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lace.errors import input_error
from lace.eval import neighbours
from lace.eval.hubness import hubness_figures
from lace.eval.metrics import recall_from_neighbours
from lace.eval.neighbours import DEFAULT_CHUNK, EXACT, KnnOptions, Neighbours, cross_neighbours
from lace.eval.reciprocity import mutual_knn_overlap, one_way_rates
from lace.eval.rerank import QueryBank, RerankOptions, reranked_neighbours


@dataclass(frozen=True)
class GeometryOptions:
    """What `geometry_diagnostics` measures and how."""

    k: int = 10
    """Neighbourhood size of hubness and mutual k-NN."""
    recall_ks: tuple[int, ...] = (1, 5, 10)
    """Cut-offs of recall@k."""
    hub_size: float = 2.0
    """An item is a hub when N_k >= hub_size * k."""
    baseline: bool = True
    """Repeat the figures on isotropic random unit vectors of the same sizes."""
    seed: int = 0
    """Seed of the random baseline."""
    chunk: int = DEFAULT_CHUNK
    """Image rows per block of the similarity pass."""
    knn: KnnOptions = EXACT
    """How the top-k lists are searched (exact by default; FAISS for 1M+ items)."""


def _depth(options: GeometryOptions, recall: bool) -> int:
    return max(options.k, max(options.recall_ks) if recall else 1)


def _space_figures(
    images: torch.Tensor, texts: torch.Tensor, owner: np.ndarray, options: GeometryOptions, recall: bool
) -> dict[str, float]:
    forward, backward = cross_neighbours(images, texts, _depth(options, recall), chunk=options.chunk, knn=options.knn)
    return neighbour_figures(forward, backward, owner, images.shape[0], texts.shape[0], options, recall)


def neighbour_figures(
    forward: Neighbours, backward: Neighbours, owner: np.ndarray, n_images: int, n_texts: int,
    options: GeometryOptions, recall: bool = True,
) -> dict[str, float]:
    """Recall, hubness, one-way and mutual k-NN figures from (N_img, depth) and (N_txt, depth) top-k lists."""
    figures: dict[str, float] = {}
    if recall:
        figures.update(recall_from_neighbours(forward.indices, backward.indices, owner, options.recall_ks))
    k = min(options.k, forward.k, backward.k)
    # hubness of captions as neighbours of images (i2t lists), and of images as neighbours of captions
    for prefix, part in (("hubness/i2t", hubness_figures(forward.indices, n_texts, k, options.hub_size)),
                         ("hubness/t2i", hubness_figures(backward.indices, n_images, k, options.hub_size)),
                         ("one_way", one_way_rates(forward.indices, backward.indices, owner)),
                         ("mutual_knn", mutual_knn_overlap(forward.indices, backward.indices, k))):
        figures.update({f"{prefix}/{name}": value for name, value in part.items()})
    return figures


def isotropic_like(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """(n, d) unit vectors drawn uniformly on the sphere."""
    return F.normalize(torch.randn(n, d, generator=generator), dim=1)


def _checked(image_embeddings, text_embeddings, text_image_index) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    images, texts = neighbours.as_float_tensor(image_embeddings), neighbours.as_float_tensor(text_embeddings)
    owner = np.asarray(text_image_index, dtype=np.int64)
    if images.ndim != 2 or texts.ndim != 2 or not len(images) or not len(texts):
        raise input_error("geometry", "embeddings", "(N_img, d) images and (N_txt, d) captions, at least one each",
                          (tuple(images.shape), tuple(texts.shape)))
    if owner.shape != (texts.shape[0],) or (owner.size and (owner.min() < 0 or owner.max() >= images.shape[0])):
        raise ValueError(f"text_image_index must give an image row in [0, {images.shape[0]}) for each of "
                         f"{texts.shape[0]} captions")
    return images, texts, owner


def geometry_diagnostics(
    image_embeddings: np.ndarray | torch.Tensor,
    text_embeddings: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    options: GeometryOptions = GeometryOptions(),
) -> dict[str, float]:
    """Retrieval and geometry figures of one space.

    Args:
        image_embeddings: (N_img, d) unit vectors.
        text_embeddings: (N_txt, d) unit vectors.
        text_image_index: (N_txt,) image row of each caption.

    Returns:
        A flat dict: `i2t/R@k`, `t2i/R@k`, `hubness/{i2t,t2i}/<figure>`,
        `one_way/{image,text}`, `mutual_knn/{image,text}`, and with `options.baseline`
        the same geometry keys prefixed by `isotropic/`.
    """
    images, texts, owner = _checked(image_embeddings, text_embeddings, text_image_index)
    figures = _space_figures(images, texts, owner, options, recall=True)
    if options.baseline:
        generator = torch.Generator().manual_seed(options.seed)
        random_images = isotropic_like(images.shape[0], images.shape[1], generator)
        random_texts = isotropic_like(texts.shape[0], texts.shape[1], generator)
        random_figures = _space_figures(random_images, random_texts, owner, options, recall=False)
        figures.update({f"isotropic/{name}": value for name, value in random_figures.items()})
    return figures


def reranked_geometry(
    image_embeddings: np.ndarray | torch.Tensor,
    text_embeddings: np.ndarray | torch.Tensor,
    text_image_index: Sequence[int] | np.ndarray,
    methods: Sequence[str],
    bank: QueryBank | None = None,
    options: GeometryOptions = GeometryOptions(),
    rerank_options: RerankOptions | None = None,
) -> dict[str, float]:
    """Retrieval and geometry figures of one space under each hubness fix (`lace.eval.rerank`).

    Args: as `geometry_diagnostics`, plus `methods` (some of csls, qbnorm, dn) and the
    `bank` the fixes take their statistics from (default: the evaluated sets) and their
    knobs (default: `RerankOptions()`, the published values).

    Returns:
        `rerank/<method>/<key>` for every key `geometry_diagnostics` gives without the
        isotropic baseline (recall, hubness, one-way, mutual k-NN).
    """
    images, texts, owner = _checked(image_embeddings, text_embeddings, text_image_index)
    figures: dict[str, float] = {}
    for method in methods:
        forward, backward = reranked_neighbours(method, images, texts, _depth(options, True), bank=bank,
                                                options=rerank_options or RerankOptions(), chunk=options.chunk,
                                                knn=options.knn)
        for name, value in neighbour_figures(forward, backward, owner, images.shape[0], texts.shape[0],
                                             options).items():
            figures[f"rerank/{method}/{name}"] = value
    return figures
