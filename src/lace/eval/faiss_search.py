"""Top-k search through a FAISS index, for galleries past brute force's reach.

Three index types, all by inner product (cosine similarity for unit vectors):
- **flat** (`IndexFlatIP`): exact, the same lists as `lace.eval.neighbours`' chunked
  search (up to ties and float rounding), with FAISS's blocked BLAS kernels.
- **ivf** (`IndexIVFFlat`): k-means cells (`nlist`, trained on a seeded sample of at most
  64 points per cell, 10 k-means iterations); each query scans its `nprobe` nearest cells. Approximate.
- **hnsw** (`IndexHNSWFlat`): a navigable small-world graph (`hnsw_m` links per node,
  `ef_construction` and `ef_search` candidate lists). Approximate, no training.
With a FAISS build that sees GPUs (faiss-gpu), flat and IVF indexes move to all of them
(a path not exercised on the reference machine, which has no GPU).
`KnnOptions` (how top-k lists are searched) lives here; `lace.eval.neighbours` dispatches to this
module, and searches exactly the queries for which an approximate index finds fewer than k items.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lace.errors import LaceInputError, input_error

TRAINING_POINTS_PER_LIST = 64
KMEANS_ITERATIONS = 10

KNN_BACKENDS = ("exact", "faiss")
FAISS_INDEXES = ("flat", "ivf", "hnsw")


@dataclass(frozen=True)
class KnnOptions:
    """How top-k lists are searched: exact chunked brute force, or a FAISS index."""

    backend: str = "exact"
    """exact (chunked brute force, the default) or faiss (for 1M+ items; needs faiss-cpu)."""
    index: str = "flat"
    """FAISS index: flat (exact inner product), ivf (IVF-Flat, approximate) or hnsw (approximate)."""
    nlist: int = 0
    """IVF: inverted lists (k-means cells); 0 takes 4 sqrt(G), at most G / 39."""
    nprobe: int = 32
    """IVF: cells searched per query (more: slower, higher recall)."""
    hnsw_m: int = 32
    """HNSW: links per node."""
    ef_construction: int = 80
    """HNSW: candidate list while building."""
    ef_search: int = 128
    """HNSW: candidate list while searching (more: slower, higher recall)."""
    seed: int | None = 0
    """Seed of the IVF training sample and k-means; none: the seed of the evaluation that holds these options
    (`lace eval --seed`), 0 for a search made alone."""

    def __post_init__(self):
        if self.backend not in KNN_BACKENDS:
            raise input_error("knn options", "knn", f"one of {list(KNN_BACKENDS)}", self.backend)
        if self.index not in FAISS_INDEXES:
            raise input_error("knn options", "knn_index", f"one of {list(FAISS_INDEXES)}", self.index)
        for name in ("nprobe", "hnsw_m", "ef_construction", "ef_search"):
            if getattr(self, name) < 1:
                raise input_error("knn options", f"knn_{name}", "an integer >= 1", getattr(self, name))
        if self.nlist < 0:
            raise input_error("knn options", "knn_nlist", "an integer >= 0 (0: 4 sqrt(G))", self.nlist)


def import_faiss():
    """The `faiss` module, or a `LaceInputError` saying how to install it."""
    try:
        import faiss
    except ImportError as error:
        raise LaceInputError(
            "--knn faiss: the faiss module is not installed; install faiss-cpu (or faiss-gpu), "
            "e.g. pip install 'lace[scale]', or use the default --knn exact"
        ) from error
    return faiss


def ivf_lists(n_items: int, options: KnnOptions) -> int:
    """Inverted lists of an IVF index over n_items: options.nlist, else 4 sqrt(n), at most n / 39."""
    wanted = options.nlist or round(4 * math.sqrt(n_items))
    return max(1, min(wanted, n_items // 39 if n_items >= 39 else 1))


def build_index(gallery: torch.Tensor, options: KnnOptions):
    """A FAISS index of (G, d) gallery rows by inner product, built and trained per `options`."""
    faiss = import_faiss()
    vectors = np.ascontiguousarray(gallery.detach().cpu().numpy(), dtype=np.float32)
    n_items, dim = vectors.shape
    if options.index == "flat":
        index = faiss.IndexFlatIP(dim)
    elif options.index == "hnsw":
        index = faiss.IndexHNSWFlat(dim, options.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = options.ef_construction
    else:
        lists = ivf_lists(n_items, options)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
        seed = 0 if options.seed is None else options.seed
        index.cp.seed = seed
        sample = min(n_items, TRAINING_POINTS_PER_LIST * lists)
        rows = np.random.default_rng(seed).choice(n_items, sample, replace=False) if sample < n_items \
            else np.arange(n_items)
        index.cp.max_points_per_centroid = TRAINING_POINTS_PER_LIST
        index.cp.niter = KMEANS_ITERATIONS
        index.train(vectors[np.sort(rows)])
        index.nprobe = options.nprobe  # set before a GPU copy, which takes it along
    if options.index != "hnsw" and getattr(faiss, "get_num_gpus", lambda: 0)() > 0:
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(vectors)
    return index


def search_index(index, queries: torch.Tensor, k: int, options: KnnOptions) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) scores and (Q, k) int64 rows of the index's top-k for (Q, d) queries."""
    if options.index == "hnsw":
        index.hnsw.efSearch = max(options.ef_search, k)
    vectors = np.ascontiguousarray(queries.detach().cpu().numpy(), dtype=np.float32)
    return index.search(vectors, k)


def faiss_topk(queries: torch.Tensor, gallery: torch.Tensor, k: int,
               options: KnnOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, k) int64 gallery rows and (Q, k) float32 scores of the index's top-k for (Q, d) queries among (G, d)
    gallery rows; a row holds -1 where an approximate index found fewer than k items."""
    index = build_index(gallery, options)
    scores, indices = search_index(index, queries, k, options)
    return torch.from_numpy(indices).long(), torch.from_numpy(scores).float()
