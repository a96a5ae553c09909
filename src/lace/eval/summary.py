"""What `lace eval` prints of a results dict: every figure of each benchmark that is a score, and the items scored
and skipped per file; figures that describe the data (the share of same-words swap items) are left to the JSON."""

from __future__ import annotations

DATA_PROPERTY_SUFFIXES = ("same_words_share",)
"""Metric names ending so are properties of a benchmark's items, not scores of a model."""


def is_score(metric: str) -> bool:
    """Whether `metric` (a benchmark figure, `family/part/...`) scores a model (not a property of the data)."""
    return not metric.endswith(DATA_PROPERTY_SUFFIXES)


def format_value(value: float | None) -> str:
    """A figure to three decimals, or a dash where it is undefined (None)."""
    return "–" if value is None else f"{value:.3f}"


def item_line(name: str, counts: dict[str, dict[str, int]]) -> str:
    """`<name> items: <part> <scored> (<skipped> skipped), ...; <scored> scored, <skipped> skipped in all`."""
    parts = [f"{part} {c['scored']}" + (f" ({c['skipped']} skipped)" if c["skipped"] else "")
             for part, c in counts.items()]
    scored = sum(c["scored"] for c in counts.values())
    skipped = sum(c["skipped"] for c in counts.values())
    return f"{name} items: " + ", ".join(parts) + f"; {scored} scored, {skipped} skipped in all"


def console_lines(results: dict) -> list[str]:
    """Per benchmark, one line of its scores (each file, family or direction, and the mean where it has one)
    and one of its item counts; then a line on the diagnostics when they were skipped."""
    lines = []
    for name, figures in results["benchmarks"].items():
        scores = ", ".join(f"{key} {format_value(value)}" for key, value in figures.items() if is_score(key))
        lines.append(f"{name}: {scores}")
        counts = results.get("items", {}).get(name)
        if counts:
            lines.append(item_line(name, counts))
    if results.get("diagnostics_skipped"):
        lines.append(f"diagnostics skipped: {results['diagnostics_skipped']}")
    return lines
