"""The demo's figures by column (name, section, benchmark, key) and the runs behind them: what the report, the
targets, the sweep and the draws all read from results.json's evaluations."""

from __future__ import annotations

BINDING_COLUMNS = (
    ("i2t swap-att", "benchmarks", "world", "i2t/swap_attribute"),
    ("i2t swap-obj", "benchmarks", "world", "i2t/swap_object"),
    ("i2t swap-rel", "benchmarks", "world", "i2t/swap_relation"),
    ("i2t repl-att", "benchmarks", "world", "i2t/replace_attribute"),
    ("i2t repl-obj", "benchmarks", "world", "i2t/replace_object"),
    ("i2t repl-rel", "benchmarks", "world", "i2t/replace_relation"),
    ("t2i swap-att", "benchmarks", "world", "t2i/swap_attribute"),
    ("t2i swap-obj", "benchmarks", "world", "t2i/swap_object"),
    ("t2i swap-rel", "benchmarks", "world", "t2i/swap_relation"),
    ("t2i repl-att", "benchmarks", "world", "t2i/replace_attribute"),
    ("wino text", "benchmarks", "world", "winoground/text"),
    ("wino image", "benchmarks", "world", "winoground/image"),
    ("wino group", "benchmarks", "world", "winoground/group"),
)
GEOMETRY_COLUMNS = (
    ("R@1 i2t", "benchmarks", "retrieval", "i2t/R@1"),
    ("R@1 t2i", "benchmarks", "retrieval", "t2i/R@1"),
    ("R@5 t2i", "benchmarks", "retrieval", "t2i/R@5"),
    ("skew N10 i2t", "diagnostics", None, "hubness/i2t/skewness"),
    ("skew N10 t2i", "diagnostics", None, "hubness/t2i/skewness"),
    ("hub occ. t2i", "diagnostics", None, "hubness/t2i/hub_occupancy"),
    ("one-way img", "diagnostics", None, "one_way/image"),
    ("one-way txt", "diagnostics", None, "one_way/text"),
    ("brittle rule", "diagnostics", None, "brittleness/rule/all"),
    ("brittle cf", "diagnostics", None, "brittleness/counterfactual/all"),
)
SUMMARY_COLUMNS = (
    BINDING_COLUMNS[0], BINDING_COLUMNS[1], BINDING_COLUMNS[6], BINDING_COLUMNS[7], BINDING_COLUMNS[12],
    GEOMETRY_COLUMNS[0], GEOMETRY_COLUMNS[1], GEOMETRY_COLUMNS[4], GEOMETRY_COLUMNS[6],
)
def metric(split_results: dict, column: tuple) -> float | None:
    _, section, benchmark, key = column
    values = split_results[section] if benchmark is None else split_results[section].get(benchmark, {})
    value = values.get(key)
    return None if value is None else float(value)


def variant_of(model: str) -> str:
    return model.rsplit(" seed ", 1)[0]


def seed_values(evaluations: dict, split: str, columns) -> dict[str, list[list[float]]]:
    """Per variant, per column: the figure of each of its seeds on `split` (those that have it), in model order."""
    by_variant: dict[str, list[dict]] = {}
    for model, results in evaluations.items():
        by_variant.setdefault(variant_of(model), []).append(results[split])
    return {variant: [[v for v in (metric(run, column) for run in runs) if v is not None] for column in columns]
            for variant, runs in by_variant.items()}
