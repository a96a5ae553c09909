"""Top-k search through FAISS (`lace.eval.faiss_search`) against the exact chunked search."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from lace.errors import LaceInputError
from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics
from lace.eval.neighbours import KnnOptions, cross_neighbours, topk_neighbours

pytest.importorskip("faiss")


def _unit(n: int, d: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def _clustered(n: int, d: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(20, d, generator=generator)
    return F.normalize(centres[torch.randint(20, (n,), generator=generator)]
                       + 0.5 * torch.randn(n, d, generator=generator), dim=1)


def test_faiss_flat_gives_the_exact_top_k_indices_and_similarities():
    queries, gallery = _unit(70, 24, 0), _unit(300, 24, 1)
    flat = KnnOptions(backend="faiss", index="flat")
    exact = topk_neighbours(queries, gallery, 10)
    found = topk_neighbours(queries, gallery, 10, knn=flat)
    assert torch.equal(found.indices, exact.indices)
    torch.testing.assert_close(found.scores, exact.scores, atol=1e-5, rtol=1e-5)
    # both directions of the one-pass cross search, with a different reverse depth
    exact_pair = cross_neighbours(queries, gallery, 5, reverse_k=7)
    found_pair = cross_neighbours(queries, gallery, 5, reverse_k=7, knn=flat)
    for mine, reference in zip(found_pair, exact_pair):
        assert torch.equal(mine.indices, reference.indices)
        torch.testing.assert_close(mine.scores, reference.scores, atol=1e-5, rtol=1e-5)


def test_ivf_probing_every_list_is_exact_and_hnsw_recall_is_high():
    queries, gallery = _clustered(100, 32, 2), _clustered(2000, 32, 3)
    exact = topk_neighbours(queries, gallery, 10).indices
    every_list = KnnOptions(backend="faiss", index="ivf", nlist=16, nprobe=16)
    assert torch.equal(topk_neighbours(queries, gallery, 10, knn=every_list).indices, exact)
    for options in (KnnOptions(backend="faiss", index="ivf", nlist=40, nprobe=4),
                    KnnOptions(backend="faiss", index="hnsw", hnsw_m=16, ef_search=64)):
        found = topk_neighbours(queries, gallery, 10, knn=options).indices
        assert found.shape == exact.shape and (found >= 0).all()
        recall = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, exact)) / exact.numel()
        assert recall > 0.8, (options.index, recall)


def test_geometry_figures_through_faiss_flat_equal_the_exact_figures():
    images, texts = _unit(40, 16, 4), _unit(80, 16, 5)
    owner = torch.arange(80) // 2
    exact = geometry_diagnostics(images, texts, owner)
    through_faiss = geometry_diagnostics(images, texts, owner, GeometryOptions(knn=KnnOptions(backend="faiss")))
    assert through_faiss.keys() == exact.keys()
    for key, value in exact.items():
        assert through_faiss[key] == pytest.approx(value, abs=1e-6), key


def test_bad_knn_options_and_a_missing_faiss_are_named(monkeypatch):
    with pytest.raises(LaceInputError, match="knn_index"):
        KnnOptions(backend="faiss", index="lsh")
    with pytest.raises(LaceInputError, match="'knn'"):
        KnnOptions(backend="annoy")
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss now fails
    with pytest.raises(LaceInputError, match="faiss-cpu"):
        topk_neighbours(_unit(5, 8, 6), _unit(9, 8, 7), 3, knn=KnnOptions(backend="faiss"))

