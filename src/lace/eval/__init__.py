"""Measuring a shared space: metrics (pure functions), benchmarks (registered by name),
geometry diagnostics, and the `lace eval` runner."""

from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics
from lace.eval.hubness import hubness_figures, k_occurrence
from lace.eval.metrics import (
    pairwise_accuracy,
    recall_at_k,
    recall_from_neighbours,
    retrieval_recall,
    winoground_scores,
)
from lace.eval.neighbours import KnnOptions, Neighbours, cross_neighbours, topk_neighbours
from lace.eval.reciprocity import mutual_knn_overlap, one_way_rates

__all__ = [
    "GeometryOptions", "KnnOptions", "Neighbours", "cross_neighbours", "geometry_diagnostics", "hubness_figures",
    "k_occurrence", "mutual_knn_overlap", "one_way_rates", "pairwise_accuracy", "recall_at_k",
    "recall_from_neighbours", "retrieval_recall", "topk_neighbours", "winoground_scores",
]
