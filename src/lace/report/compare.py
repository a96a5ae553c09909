"""Side-by-side comparison of `lace eval` results: a markdown table with deltas, a bar chart."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lace.errors import LaceInputError
from lace.eval.summary import format_value, is_score
from lace.io import read_json


@dataclass
class Results:
    """One results file: its label and its metrics flattened to `section/name/metric` keys."""

    label: str
    metrics: dict[str, float | None]


def flatten_results(results: dict, where: object = "results") -> dict[str, float | None]:
    """`{"benchmarks": {b: {m: v}}, "diagnostics": {m: v}}` -> {"b/m": v, "diagnostics/m": v}."""
    if not isinstance(results, dict) or not isinstance(results.get("benchmarks"), dict):
        raise LaceInputError(f"{where}: field 'benchmarks' missing; expected a results file written by `lace eval`")
    flat: dict[str, float | None] = {}
    for name, figures in results["benchmarks"].items():
        if not isinstance(figures, dict):
            raise LaceInputError(f"{where}: field 'benchmarks.{name}': expected a mapping of metric -> value")
        for metric, value in figures.items():
            flat[f"{name}/{metric}"] = value
    for metric, value in (results.get("diagnostics") or {}).items():
        flat[f"diagnostics/{metric}"] = value
    return flat


def load_results(paths: list[str | Path]) -> list[Results]:
    """Read results files; labels are the file names (the parent folder too when names repeat)."""
    paths = [Path(p) for p in paths]
    stems = [p.stem for p in paths]
    labels = [f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]
    return [Results(label, flatten_results(read_json(path), path)) for label, path in zip(labels, paths)]


def _delta(value: float | None, reference: float | None) -> str:
    return "–" if value is None or reference is None else f"{value - reference:+.3f}"


def comparison_table(results: list[Results], labels: list[str] | None = None) -> str:
    """Markdown table: one row per metric, one column per results file, then deltas vs the first."""
    if not results:
        raise LaceInputError("nothing to compare: give at least one results file")
    labels = labels or [r.label for r in results]
    if len(labels) != len(results):
        raise LaceInputError(f"--labels: expected {len(results)} names, got {len(labels)}")
    metrics = list(dict.fromkeys(key for r in results for key in r.metrics))
    header = ["metric", *labels, *[f"Δ {label}" for label in labels[1:]]]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for metric in metrics:
        values = [r.metrics.get(metric) for r in results]
        cells = [metric, *map(format_value, values), *[_delta(v, values[0]) for v in values[1:]]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison_chart(results: list[Results], path: str | Path, labels: list[str] | None = None) -> Path:
    """Grouped bar chart of the benchmark scores (`lace.report.plots.grouped_bars`, one colour per results file;
    diagnostics left out: they have other scales; so are the figures that describe the data, such as the share of
    same-words items)."""
    from lace.report.plots import grouped_bars

    labels = labels or [r.label for r in results]
    metrics = [key for key in dict.fromkeys(k for r in results for k in r.metrics)
               if not key.startswith("diagnostics/") and is_score(key)]
    if not metrics:
        raise LaceInputError("no benchmark metrics to chart")
    values = {metric: {label: math.nan if result.metrics.get(metric) is None else result.metrics[metric]
                       for result, label in zip(results, labels)} for metric in metrics}
    return grouped_bars(values, path, "benchmark scores", "score")
