"""Hubness of k-NN lists (Radovanović et al., JMLR 2010), with scikit-hubness's formulas.

`N_k(g)` is the number of queries whose top-k holds gallery item g (the k-occurrence).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from lace.eval.metrics import as_numpy


def k_occurrence(indices: np.ndarray | torch.Tensor, n_gallery: int, k: int | None = None) -> np.ndarray:
    """(G,) int64 `N_k`: how many of the (Q, >= k) top-k lists hold each gallery row."""
    indices = as_numpy(indices)
    k = indices.shape[1] if k is None else k
    return np.bincount(indices[:, :k].ravel().astype(np.int64), minlength=n_gallery)


def hubness_figures(
    indices: np.ndarray | torch.Tensor, n_gallery: int, k: int = 10, hub_size: float = 2.0
) -> dict[str, float]:
    """Hubness of (Q, >= k) top-k lists over a gallery of `n_gallery` items.

    Returns:
        skewness: sample skewness of `N_k` (`scipy.stats.skew`, biased, as scikit-hubness);
        robin_hood: share of k-occurrence to redistribute for all items to be equally
            popular, 0.5 * sum |N_k - mean| / sum N_k;
        hub_occupancy: share of all Q * k slots taken by hubs, items with N_k >= hub_size * k;
        antihub_rate: share of gallery items with N_k = 0;
        largest_hub_share: max N_k / (Q * k), the share of slots the biggest hub takes.
    """
    if indices.shape[1] < k:
        raise ValueError(f"hubness at k={k} needs top-{k} lists, got {indices.shape[1]} neighbours")
    n_queries = int(indices.shape[0])
    occurrence = k_occurrence(indices, n_gallery, k)
    total = float(occurrence.sum())  # = n_queries * k
    hubs = occurrence >= hub_size * k
    return {
        "skewness": float(stats.skew(occurrence)),
        "robin_hood": 0.5 * float(np.abs(occurrence - occurrence.mean()).sum()) / total,
        "hub_occupancy": float(occurrence[hubs].sum()) / k / n_queries,
        "antihub_rate": float((occurrence == 0).mean()),
        "largest_hub_share": float(occurrence.max()) / n_queries / k,
    }
