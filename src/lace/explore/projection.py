"""A 2-D map of embeddings: UMAP when the package is installed, else PCA."""

from __future__ import annotations

import importlib.util

import numpy as np

UMAP_MIN_ROWS = 20  # UMAP's default 15 neighbours need a few more rows than that


def pca_2d(rows: np.ndarray) -> np.ndarray:
    """(N, d) -> (N, 2): the rows centred and projected on their two leading principal axes."""
    centred = rows - rows.mean(axis=0, keepdims=True)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    return (centred @ components[:2].T).astype(np.float32)


def project_2d(rows: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    """(N, d) -> ((N, 2) coordinates, method name "umap" or "pca")."""
    if importlib.util.find_spec("umap") is not None and len(rows) >= UMAP_MIN_ROWS:
        import umap

        return umap.UMAP(n_components=2, random_state=seed, metric="cosine").fit_transform(rows).astype(np.float32), "umap"
    return pca_2d(rows), "pca"
