"""Chunked exact top-k search between two sets of unit vectors, in bounded memory.

Every geometry figure (recall@k, hubness, one-way neighbours, mutual k-NN) is index
arithmetic on top-k lists, so the similarity matrix is computed once, a block of query
rows at a time, and never held whole. `cross_neighbours` gets both directions from that
one pass: each block's rows give the queries' top-k, and its columns update a running
top-k per gallery item.

Past a million items brute force costs hours on a CPU; `KnnOptions(backend="faiss")`
hands the same searches to a FAISS index (`lace.eval.faiss_search`, where the options
live): exact (flat) or approximate (IVF or HNSW). Exact chunked search stays the default;
a query for which an approximate index finds fewer than k items is searched exactly here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lace.errors import input_error
from lace.eval import faiss_search
from lace.eval.faiss_search import KnnOptions

__all__ = ["DEFAULT_CHUNK", "EXACT", "KnnOptions", "Neighbours", "cross_neighbours", "topk_neighbours"]

DEFAULT_CHUNK = 1024
GALLERY_BLOCK = 65536  # gallery rows per block of `topk_neighbours`: a (1024, 65536) block is 256 MB
ROW_GROUP = 16  # rows per max-reduction when screening a block for top-k entrants
FINITE_CHECK_ROWS = 65536


@dataclass
class Neighbours:
    """Top-k lists of a set of queries, best first."""

    indices: torch.Tensor
    """(Q, k) int64 gallery rows."""
    scores: torch.Tensor
    """(Q, k) float32 inner products (cosine similarities for unit vectors)."""

    @property
    def k(self) -> int:
        return int(self.indices.shape[1])


EXACT = KnnOptions()


def as_float_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A tensor, array or memory map as a float32 tensor (a tensor keeps its device)."""
    return (x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))).float()


def _check(queries: torch.Tensor, gallery: torch.Tensor, k: int) -> None:
    """Shapes, k, and finite values: a NaN scores below or above anything, so a top-k list over one
    would be silently arbitrary; refusing it costs one pass over the embeddings, not over the scores."""
    if queries.ndim != 2 or gallery.ndim != 2 or queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"expected (Q, d) and (G, d) embeddings, got {tuple(queries.shape)} and {tuple(gallery.shape)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    for name, embeddings in (("queries", queries), ("gallery", gallery)):
        for start in range(0, embeddings.shape[0], FINITE_CHECK_ROWS):  # bounded memory on pool-sized inputs
            finite = torch.isfinite(embeddings[start:start + FINITE_CHECK_ROWS]).all(dim=1)
            if not bool(finite.all()):
                row = start + int((~finite).nonzero()[0, 0])
                raise input_error(f"nearest-neighbour search: {name}", f"row {row}", "finite embedding values "
                                  "(no NaN or inf)", "NaN/inf")


class _RunningColumnTopK:
    """Top-k over rows seen so far, for every column of a stream of (c, G) score blocks.

    Once every column holds k scores, a block is compared with each column's current
    k-th best: only the few entries above it (a share that shrinks as rows accumulate)
    are gathered and merged, so a block costs one comparison pass instead of a top-k.
    """

    def __init__(self, n_columns: int, k: int, device: torch.device):
        self.k = k
        self.n_columns = n_columns
        self.values = torch.full((k, n_columns), float("-inf"), device=device)  # (k, G)
        self.indices = torch.zeros((k, n_columns), dtype=torch.long, device=device)  # (k, G)
        self.threshold = self.values[-1].clone()  # (G,) current k-th best of each column
        self.seen = 0

    def update(self, block: torch.Tensor, row_offset: int) -> None:
        if self.seen < self.k:
            self._update_dense(block, row_offset)
        else:
            self._update_sparse(block, row_offset)
        self.seen += block.shape[0]
        self.threshold = self.values[-1].clone()

    def _update_dense(self, block: torch.Tensor, row_offset: int) -> None:
        take = min(self.k, block.shape[0])
        values, indices = block.topk(take, dim=0)  # (take, G)
        self._merge(values, indices + row_offset, None)

    def _update_sparse(self, block: torch.Tensor, row_offset: int) -> None:
        rows, columns = self._entrants(block)  # entries that enter a top-k
        if rows.numel() == 0:
            return
        values = block[rows, columns]
        # group entries by column, best first, and keep at most k per column
        order = torch.argsort(values, descending=True)
        order = order[torch.argsort(columns[order], stable=True)]
        rows, columns, values = rows[order], columns[order], values[order]
        touched, counts = torch.unique_consecutive(columns, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(columns.numel(), device=block.device) - torch.repeat_interleave(starts, counts)
        slot = torch.repeat_interleave(torch.arange(touched.numel(), device=block.device), counts)
        keep = rank < self.k
        new_values = torch.full((self.k, touched.numel()), float("-inf"), device=block.device)  # (k, U)
        new_indices = torch.zeros((self.k, touched.numel()), dtype=torch.long, device=block.device)
        new_values[rank[keep], slot[keep]] = values[keep]
        new_indices[rank[keep], slot[keep]] = rows[keep] + row_offset
        self._merge(new_values, new_indices, touched)

    def _entrants(self, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, columns) of the block entries above their column's k-th best.

        A max over groups of rows is one cheap reduction pass; only the few (group,
        column) cells whose max clears the threshold are opened up entry by entry.
        """
        rows = block.shape[0]
        group = ROW_GROUP if rows % ROW_GROUP == 0 else 1
        if group == 1:
            return (block > self.threshold).nonzero(as_tuple=True)
        group_max = block.view(rows // group, group, -1).amax(dim=1)  # (c / group, G)
        groups, columns = (group_max > self.threshold).nonzero(as_tuple=True)
        members = groups[:, None] * group + torch.arange(group, device=block.device)  # (n, group)
        candidates = block[members, columns[:, None]]  # (n, group)
        hit = candidates > self.threshold[columns][:, None]
        return members[hit], columns[:, None].expand_as(members)[hit]

    def _merge(self, values: torch.Tensor, indices: torch.Tensor, columns: torch.Tensor | None) -> None:
        """Merge (m, U) candidates into the running top-k of `columns` (None: all columns)."""
        old_values = self.values if columns is None else self.values[:, columns]
        old_indices = self.indices if columns is None else self.indices[:, columns]
        merged_values = torch.cat([old_values, values])  # (k + m, U)
        merged_indices = torch.cat([old_indices, indices])
        best_values, order = merged_values.topk(self.k, dim=0)  # (k, U)
        best_indices = merged_indices.gather(0, order)
        if columns is None:
            self.values, self.indices = best_values, best_indices
        else:
            self.values[:, columns] = best_values
            self.indices[:, columns] = best_indices

    def result(self) -> Neighbours:
        return Neighbours(self.indices.T.contiguous(), self.values.T.contiguous())


@torch.no_grad()
def cross_neighbours(
    queries: np.ndarray | torch.Tensor,
    gallery: np.ndarray | torch.Tensor,
    k: int,
    reverse_k: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    device: str | torch.device | None = None,
    knn: KnnOptions = EXACT,
) -> tuple[Neighbours, Neighbours]:
    """Exact top-k of queries among gallery AND of gallery among queries, in one pass.

    Args:
        queries: (Q, d) unit vectors (e.g. images).
        gallery: (G, d) unit vectors (e.g. captions).
        k: neighbours per query, capped at G.
        reverse_k: neighbours per gallery item among the queries (default k), capped at Q.
        chunk: query rows per block; peak extra memory is about chunk * G * 4 bytes.
        device: where to compute (default: the queries' device).
        knn: search backend; with FAISS the two directions are two index searches.

    Returns:
        (forward, backward): forward.indices (Q, k) rows of `gallery`; backward.indices
        (G, reverse_k) rows of `queries`.
    """
    queries, gallery = as_float_tensor(queries), as_float_tensor(gallery)
    reverse_k = k if reverse_k is None else reverse_k
    _check(queries, gallery, min(k, reverse_k))
    if knn.backend == "faiss":
        return (_faiss_neighbours(queries, gallery, min(k, gallery.shape[0]), knn),
                _faiss_neighbours(gallery, queries, min(reverse_k, queries.shape[0]), knn))
    device = torch.device(device) if device is not None else queries.device
    gallery = gallery.to(device)
    k, reverse_k = min(k, gallery.shape[0]), min(reverse_k, queries.shape[0])
    forward_values, forward_indices = [], []
    columns = _RunningColumnTopK(gallery.shape[0], reverse_k, device)
    for start in range(0, queries.shape[0], chunk):
        block = queries[start: start + chunk].to(device) @ gallery.T  # (c, G)
        values, indices = block.topk(k, dim=1)  # (c, k)
        forward_values.append(values)
        forward_indices.append(indices)
        columns.update(block, start)
    forward = Neighbours(torch.cat(forward_indices), torch.cat(forward_values))
    return forward, columns.result()


@torch.no_grad()
def topk_neighbours(
    queries: np.ndarray | torch.Tensor,
    gallery: np.ndarray | torch.Tensor,
    k: int,
    chunk: int = DEFAULT_CHUNK,
    device: str | torch.device | None = None,
    knn: KnnOptions = EXACT,
    gallery_block: int = GALLERY_BLOCK,
) -> Neighbours:
    """Top-k gallery rows of each query by inner product: indices and scores (Q, k).

    Exact by default; `knn` may hand the search to a FAISS index. Peak extra memory is
    about chunk * min(G, gallery_block) * 4 bytes.
    """
    queries, gallery = as_float_tensor(queries), as_float_tensor(gallery)
    _check(queries, gallery, k)
    if knn.backend == "faiss":
        return _faiss_neighbours(queries, gallery, min(k, gallery.shape[0]), knn)
    device = torch.device(device) if device is not None else queries.device
    gallery = gallery.to(device)
    k = min(k, gallery.shape[0])
    values, indices = [], []
    for start in range(0, queries.shape[0], chunk):
        rows = queries[start: start + chunk].to(device)
        best_values, best_indices = None, None
        # past GALLERY_BLOCK items, the gallery is searched a block at a time and the top-k merged,
        # so memory stays at chunk x GALLERY_BLOCK scores instead of growing with G
        for offset in range(0, gallery.shape[0], gallery_block):
            block = rows @ gallery[offset: offset + gallery_block].T  # (c, b)
            top_values, top_indices = block.topk(min(k, block.shape[1]), dim=1)
            if best_values is not None:
                top_values = torch.cat([best_values, top_values], dim=1)
                top_indices = torch.cat([best_indices, top_indices + offset], dim=1)
                top_values, order = top_values.topk(k, dim=1)
                top_indices = top_indices.gather(1, order)
            best_values, best_indices = top_values, top_indices
        values.append(best_values)
        indices.append(best_indices)
    return Neighbours(torch.cat(indices), torch.cat(values))


def _faiss_neighbours(queries: torch.Tensor, gallery: torch.Tensor, k: int, knn: KnnOptions) -> Neighbours:
    """Top-k of (Q, d) queries among (G, d) gallery rows through a FAISS index; a query for which an
    approximate index finds fewer than k items is searched exactly."""
    indices, scores = faiss_search.faiss_topk(queries, gallery, k, knn)  # (Q, k) each, rows -1 where missing
    short = (indices < 0).any(dim=1)
    if short.any():
        exact = topk_neighbours(queries[short], gallery, k)
        indices[short], scores[short] = exact.indices, exact.scores
    return Neighbours(indices, scores)
