"""One summary over seeds for every proving ground: each metric's mean, spread and count, per arm."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lace.experiment.claims import spread


def summarise_over_seeds(figures: dict[str, list[dict]], metrics: Sequence[str],
                         seconds: dict[str, list[float]] | None = None) -> dict[str, dict]:
    """Per arm, `{metric: {"mean", "std", "n"}}` over its runs' figures (one dict per seed), the standard
    deviation with ddof 1 (0 for a single run); a run lacking a metric, or holding a non-finite value, is left out
    of it, and a metric no run has gets mean None and n 0. `seconds`: each arm's training seconds per run, whose
    mean is added as `train_seconds`."""
    summary = {}
    for arm, runs in figures.items():
        summary[arm] = {}
        for metric in metrics:
            values = np.array([run[metric] for run in runs if _finite(run.get(metric))], dtype=float)
            summary[arm][metric] = {"mean": float(values.mean()) if values.size else None,
                                    "std": spread(values) or 0.0,
                                    "n": int(values.size)}
        if seconds and seconds.get(arm):
            summary[arm]["train_seconds"] = float(np.mean(seconds[arm]))
    return summary


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["summarise_over_seeds"]
