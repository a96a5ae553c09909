"""Tables the demo and the study share: zero-shot before and after each fine-tune, the WiSE-FT
trade-off and the edit grids' target counts, each read from the stage results in results.json."""

from __future__ import annotations

from collections.abc import Mapping

from lace.report.document import Report, Table


def zeroshot_table(zeroshot: Mapping[str, Mapping[str, float | None]], caption: str = "") -> Table:
    """One row per model (base first, as given), top-1 of each task, then the other columns of each task.

    `zeroshot`: model -> flat figures `<task>/top1`, `<task>/top5`, `<task>/mean_per_class_recall`.
    """
    keys: list[str] = []
    for figures in zeroshot.values():
        keys += [key for key in figures if key not in keys]
    keys = sorted(keys, key=lambda key: (not key.endswith("/top1"), keys.index(key)))
    rows = [[model] + [figures.get(key) for key in keys] for model, figures in zeroshot.items()]
    return Table(["model"] + keys, rows, caption=caption)


def wise_ft_table(stage: Mapping) -> Table:
    """One row per (fine-tune, alpha) of `lace.experiment.wise_ft.wise_ft_stage`'s result."""
    metric = stage["binding_metric"]
    per_task = sorted({key for point in stage["points"] for key in point if key.startswith("zeroshot/")
                       and key != "zeroshot/top1"})
    rows = [[point["model"], point["alpha"], point["zeroshot/top1"]] + [point.get(key) for key in per_task]
            + [point[metric]] for point in stage["points"]]
    return Table(["fine-tune", "alpha", "zero-shot top-1 (mean)"] + [key.removeprefix("zeroshot/") for key in per_task]
                 + [metric], rows, caption="alpha 0 is the base, 1 the fine-tune; weights mixed tensor by tensor")


def add_edit_grid(report: Report, name: str, grid: Mapping, figure_folder: str = "figures") -> None:
    """The grid's figure and a table of its rows' target counts (or why it is missing)."""
    if "skipped" in grid:
        report.bullets([f"{name}: grid skipped: {grid['skipped']}"])
        return
    if grid["figure"] is None:
        report.bullets([f"{name}: the edit could not be made on any of the {grid['candidates']} candidate images"])
        return
    report.figure(f"{figure_folder}/{grid['figure']}",
                  f"{grid['edit']}: each row the source image and its {grid['k']} nearest real images; sources are "
                  f"the first images by id naming the source and not the target, chosen before any edit")
    report.table(Table(["source image", "its caption", "row", f"of {grid['k']} neighbours show {grid['target']}"],
                       [[row.get("image", row["source"]), row.get("caption"), row["label"], row["target_count"]]
                        for row in grid["rows"]]))
