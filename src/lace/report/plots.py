"""Plots for reports: grouped bars, N_k histograms, image grids, active-atom bars.

Every function writes one PNG (atomically) and returns its path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from PIL import Image

from lace.io import atomic_path


def _save(figure, path: str | Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def series_colours(count: int) -> list | None:
    """Colours of `count` series: None (matplotlib's own cycle of ten) up to ten, else twenty distinct ones, so
    that no two series of a full demo share a colour."""
    if count <= 10:
        return None
    return [plt.get_cmap("tab20")(i % 20) for i in range(count)]


def grouped_bars(
    values: Mapping[str, Mapping[str, float]], path: str | Path, title: str, ylabel: str = "",
    errors: Mapping[str, Mapping[str, float]] | None = None, chance: Mapping[str, float] | None = None,
) -> Path:
    """`values[metric][series]` as groups of bars, one colour per series; `chance[metric]`: a dashed chance line
    across that metric's group only (metrics without a defined chance get none)."""
    metrics = list(values)
    series = list(dict.fromkeys(s for m in metrics for s in values[m]))
    width = 0.8 / max(len(series), 1)
    figure, axis = plt.subplots(figsize=(max(6, 1.3 * len(metrics) * max(1, len(series) / 3)), 3.8))
    x = np.arange(len(metrics))
    colours = series_colours(len(series))
    for i, name in enumerate(series):
        heights = [values[m].get(name, np.nan) for m in metrics]
        yerr = [errors[m].get(name, 0.0) for m in metrics] if errors else None
        axis.bar(x + (i - (len(series) - 1) / 2) * width, heights, width, yerr=yerr, label=name, capsize=2,
                 color=colours[i] if colours else None)
    for position, metric in enumerate(metrics):
        if chance and metric in chance:
            axis.hlines(chance[metric], position - 0.45, position + 0.45, color="grey", linestyle="--", linewidth=1,
                        label="chance" if metric == next(m for m in metrics if m in chance) else None)
    axis.set_xticks(x, metrics, rotation=20, ha="right")
    axis.set(ylabel=ylabel, title=title)
    axis.legend(fontsize=8, ncol=min(len(series) + 1, 4))
    axis.grid(axis="y", alpha=0.3)
    return _save(figure, path)


def nk_histograms(counts: Mapping[str, np.ndarray], path: str | Path, title: str, k: int) -> Path:
    """Histograms of N_k (how often each gallery item is in someone's top-k), one per model."""
    figure, axis = plt.subplots(figsize=(6.5, 3.6))
    largest = max(int(np.max(c)) for c in counts.values()) if counts else 1
    bins = np.arange(0, largest + 2) - 0.5 if largest < 60 else 40
    colours = series_colours(len(counts))
    for i, (name, values) in enumerate(counts.items()):
        axis.hist(values, bins=bins, histtype="step", linewidth=1.5, label=name,
                  color=colours[i] if colours else None)
    axis.axvline(2 * k, color="grey", linestyle=":", linewidth=1, label=f"hub threshold 2k={2 * k}")
    axis.set_yscale("log")
    plain_log_labels(axis.yaxis)
    axis.set(xlabel=f"N_{k}", ylabel="gallery items", title=title)
    axis.legend(fontsize=8)
    return _save(figure, path)


def plain_log_labels(axis) -> None:
    """Label a log axis with plain numbers at 1, 2, 5, 10, 20, ... and nothing else (no "6×10⁰")."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def image_grid(
    rows: Sequence[tuple[str, Sequence[Image.Image], Sequence[str] | None]], path: str | Path,
    title: str = "", cell: float = 1.1,
) -> Path:
    """Rows of images, each row labelled on the left; optional short text under each image."""
    n_cols = max(len(images) for _, images, _ in rows)
    figure, axes = plt.subplots(len(rows), n_cols, figsize=(cell * n_cols + 1.6, cell * 1.25 * len(rows)),
                                squeeze=False)
    for r, (label, images, texts) in enumerate(rows):
        for c in range(n_cols):
            axis = axes[r][c]
            axis.axis("off")
            if c < len(images):
                axis.imshow(np.asarray(images[c]))
                if texts is not None and c < len(texts):
                    axis.set_title(texts[c], fontsize=6)
        axes[r][0].text(-0.15, 0.5, label, transform=axes[r][0].transAxes, ha="right", va="center", fontsize=8)
    if title:
        height = cell * 1.25 * len(rows)
        # the title sits just above the first row at any height
        figure.subplots_adjust(top=1 - 0.8 / height)
        figure.suptitle(title, fontsize=10, y=1 - 0.2 / height)
    return _save(figure, path)


def atom_bars(
    panels: Sequence[tuple[str, np.ndarray]], atom_labels: Sequence[str], path: str | Path, title: str = "",
) -> Path:
    """Active atoms of one embedding, one panel per state (before, after each edit).

    `panels[i][1]` is a code vector of shape (K,); atoms active in any panel are shown.
    """
    codes = np.stack([np.asarray(c, dtype=float) for _, c in panels])
    active = np.flatnonzero(np.abs(codes).sum(axis=0) > 1e-6)
    order = active[np.argsort(-np.abs(codes[0, active]))]
    figure, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 0.32 * len(order) + 1.4),
                                sharey=True, squeeze=False)
    names = [f"{k}: {atom_labels[k]}" for k in order]
    for axis, (label, code) in zip(axes[0], panels):
        axis.barh(range(len(order)), code[order], color=["C0" if v >= 0 else "C3" for v in code[order]])
        axis.set_yticks(range(len(order)), names, fontsize=7)
        axis.invert_yaxis()
        axis.set_title(label, fontsize=9)
        axis.grid(axis="x", alpha=0.3)
    if title:
        figure.suptitle(title, fontsize=10)
    return _save(figure, path)


def tradeoff_curves(
    curves: Mapping[str, Sequence[tuple[float, float, str]]], path: str | Path, title: str,
    xlabel: str, ylabel: str,
) -> Path:
    """One line per series through its (x, y) points, each point labelled (e.g. by its WiSE-FT alpha)."""
    figure, axis = plt.subplots(figsize=(5.6, 4.2))
    for name, points in curves.items():
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        axis.plot(xs, ys, marker="o", linewidth=1.5, label=name)
        for x, y, label in points:
            axis.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    axis.set(xlabel=xlabel, ylabel=ylabel)
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)
