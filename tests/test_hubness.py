"""Hubness figures against an independent computation from the published definitions."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import skew

from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics
from lace.eval.hubness import hubness_figures, k_occurrence


def reference_hubness(neighbours: np.ndarray, n_gallery: int, k: int, hub_size: float = 2.0) -> dict:
    """Plain loops over the definitions (Radovanović et al. 2010; Feldbauer et al. 2018)."""
    occurrence = [0] * n_gallery
    for row in neighbours:
        for g in row[:k]:
            occurrence[g] += 1
    occurrence = np.array(occurrence, dtype=float)
    n_queries = len(neighbours)
    mean = sum(occurrence) / n_gallery
    robin_hood = 0.5 * sum(abs(x - mean) for x in occurrence) / sum(occurrence)
    hub_slots = sum(x for x in occurrence if x >= hub_size * k)
    return {
        "skewness": skew(occurrence),
        "robin_hood": robin_hood,
        "hub_occupancy": hub_slots / (n_queries * k),
        "antihub_rate": sum(1 for x in occurrence if x == 0) / n_gallery,
        "largest_hub_share": max(occurrence) / (n_queries * k),
    }


def test_hubness_matches_the_reference_on_a_skewed_graph():
    rng = np.random.default_rng(0)
    n_queries, n_gallery, k = 300, 120, 10
    # popular items drawn far more often: a hubby neighbour graph
    weights = rng.pareto(1.5, n_gallery) + 0.01
    neighbours = np.stack([rng.choice(n_gallery, k, replace=False, p=weights / weights.sum())
                           for _ in range(n_queries)])
    figures = hubness_figures(neighbours, n_gallery, k)
    expected = reference_hubness(neighbours, n_gallery, k)
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert figures["skewness"] > 1 and figures["hub_occupancy"] > 0 and figures["antihub_rate"] > 0


def test_hubness_uses_only_the_first_k_columns():
    neighbours = np.array([[0, 1, 2], [0, 2, 1], [0, 1, 2]])
    assert k_occurrence(neighbours, 4, k=1).tolist() == [3, 0, 0, 0]
    figures = hubness_figures(neighbours, 4, k=1)
    assert figures["largest_hub_share"] == pytest.approx(1.0)
    assert figures["antihub_rate"] == pytest.approx(0.75)
    assert figures["hub_occupancy"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        hubness_figures(neighbours, 4, k=5)


def test_geometry_diagnostics_are_consistent_and_beat_the_isotropic_baseline():
    torch.manual_seed(0)
    images = F.normalize(torch.randn(200, 32), dim=1)
    owner = np.repeat(np.arange(200), 2)
    texts = F.normalize(images[owner] + 0.1 * torch.randn(400, 32), dim=1)
    figures = geometry_diagnostics(images, texts, owner, GeometryOptions(k=10, chunk=64, seed=3))
    scores = (images @ texts.T).numpy()
    expected = reference_hubness(np.argsort(-scores, axis=1)[:, :10], 400, 10)
    for name, value in expected.items():
        assert figures[f"hubness/i2t/{name}"] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    assert figures["i2t/R@1"] > 0.9
    # aligned pairs point back at each other far more often than random vectors
    assert figures["one_way/image"] < figures["isotropic/one_way/image"]
    assert figures["mutual_knn/image"] > figures["isotropic/mutual_knn/image"]
    again = geometry_diagnostics(images, texts, owner, GeometryOptions(k=10, chunk=64, seed=3))
    assert again == figures  # seeded baseline
