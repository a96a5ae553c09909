"""`lace demo-draws`: several demo runs on one world, one base draw each, pooled into one report.

A demo's figures depend on the draw of its base (the pretraining's initial weights and data order), not only
on the fine-tune seed. Each run folder holds one draw (`lace demo --base-seed K`) and every fine-tune seed
from it; several folders of one draw (other arms fine-tuned from the same base, `lace demo --reuse`) are read
as one. Per variant and figure, the report gives the mean over draws x seeds, the spread across draws (the
std of the per-draw means) and the spread across fine-tune seeds (the mean of the within-draw stds), then the
pre-registered targets checked on those means, each met or missed and by how much. Stds are population stds
(numpy's default), as in the demo's own tables.

The best LACE arm is chosen on the validation split (`choose_best`), never on test.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lace.demo.columns import (
    BINDING_COLUMNS,
    GEOMETRY_COLUMNS,
    SUMMARY_COLUMNS,
    seed_values,
    variant_of,
)
from lace.demo.pipeline import finetune_folder
from lace.demo.targets import SELECTION_COLUMNS, VERDICT_NOTE, choose_by_figures, runs_of
from lace.errors import LaceInputError, input_error
from lace.experiment.claims import (
    Run,
    Samples,
    Target,
    Verdict,
    assign_roles,
    check,
    difference,
    gap_share,
    spread,
)
from lace.experiment.variants import ROLES, VARIANTS, with_caption_negatives
from lace.io import atomic_write_json, atomic_write_text, read_json
from lace.report.document import Report, Table

DRAW_SPLITS = ("test", "test_comp", "val")
FIGURES = BINDING_COLUMNS + GEOMETRY_COLUMNS
COLUMNS = {column[0]: column for column in FIGURES}
COLUMN_NAMES = list(COLUMNS)
SAME_IN_EVERY_DRAW = ("seed", "world_images", "image_size", "model", "loss", "batch_size", "base_steps", "base_lr",
                      "dictionary", "finetune")
"""Demo settings every draw shares (besides the world): what a draw varies is the base's pretraining seed; the
variants run and the number of fine-tune seeds may differ."""
SWAP_FAMILIES = ("i2t swap-att", "t2i swap-att", "i2t swap-obj", "t2i swap-obj")
PROBE_AUC_LIMIT = 0.65
PREFERS_EDITED = "provenance_edited_caption_prefers_edited_image"


@dataclass
class Draw:
    """One base draw: its first results.json (`path`), the summary of every run of it (`summary`, their
    evaluations and provenance merged), its base's pretraining seed, and the run folder of each fine-tune the
    first run does not hold (`folders`, by model name)."""

    path: Path
    summary: dict
    base_seed: int
    folders: dict[str, Path] = field(default_factory=dict)
    paths: list[Path] = field(default_factory=list)
    """Every results.json read into this draw, `path` first."""

    def __post_init__(self):
        self.paths = self.paths or [self.path]

    @property
    def run(self) -> Path:
        return self.path.parent

    def folder_of(self, model: str) -> Path:
        """The run folder holding `model`'s fine-tune."""
        return self.folders.get(model, self.run)

    def merge(self, path: Path, summary: dict) -> None:
        """Add another run of this draw: refused unless its base's figures are this draw's (the same base) and
        it fine-tuned no model this draw already holds."""
        if _base_figures(summary) != _base_figures(self.summary):
            raise LaceInputError(f"{path}: field 'evaluations.base': expected the base figures of {self.path} "
                                 f"(another run of pretraining seed {self.base_seed} must start from the same base, "
                                 "e.g. with lace demo --reuse), got other figures")
        twice = [model for model in summary["evaluations"] if model != "base" and model in self.summary["evaluations"]]
        if twice:
            raise input_error(path, "evaluations", f"fine-tunes {self.path} does not hold (a model in one run of a "
                              "draw only)", twice)
        merged = dict(self.summary)
        for key in ("evaluations", "provenance"):
            merged[key] = {**summary.get(key, {}), **self.summary.get(key, {})}
        self.summary = merged
        self.folders.update({model: path.parent for model in summary["evaluations"] if model != "base"})
        self.paths.append(path)


@dataclass
class Pooled:
    """One figure of one variant over draws: mean over draws x seeds, the std of the per-draw means (None with one
    draw), the mean within-draw std over seeds (None where no draw has two seeds), and how many draws and runs."""

    mean: float | None
    across_draws: float | None
    across_seeds: float | None
    draws: int
    runs: int


def _base_figures(summary: dict) -> dict:
    """The base's evaluation figures per split, without the seconds they took."""
    return {split: {key: value for key, value in figures.items() if key != "seconds"}
            for split, figures in summary["evaluations"].get("base", {}).items()}


def read_draws(runs: Sequence[str | Path]) -> list[Draw]:
    """Each run's results.json (a run folder or the file itself), one `Draw` per base draw (runs of one draw
    merged), refused unless every run is on one world with one set of demo settings."""
    if not runs:
        raise input_error("demo draws", "runs", "at least one demo run folder")
    draws: list[Draw] = []
    for run in runs:
        path = Path(run) / "results.json" if Path(run).is_dir() else Path(run)
        summary = read_json(path, dict)
        for name in ("config", "world", "evaluations"):
            if not isinstance(summary.get(name), dict):
                raise input_error(path, name, "the results.json of a finished demo run", type(summary.get(name)).__name__)
        config = summary["config"]
        draw = Draw(path, summary, config["seed"] if config.get("base_seed") is None else config["base_seed"])
        if draws:
            _check_same_world(draws[0], draw)
        same = next((other for other in draws if other.base_seed == draw.base_seed), None)
        if same is not None:
            same.merge(path, summary)
        else:
            draws.append(draw)
    return draws


def _check_same_world(first: Draw, draw: Draw) -> None:
    """Refuse `draw` unless its world (all but the processes that rendered it) and shared settings are `first`'s."""
    world = {key: value for key, value in first.summary["world"].items() if key != "workers"}
    other = {key: value for key, value in draw.summary["world"].items() if key != "workers"}
    pairs = [("world", world, other)] + [(f"config.{name}", first.summary["config"].get(name),
                                          draw.summary["config"].get(name)) for name in SAME_IN_EVERY_DRAW]
    for where, expected, got in pairs:
        field = _first_difference(expected, got, where)
        if field is not None:
            raise LaceInputError(f"{draw.path}: field '{field}': expected {_at(expected, field, where)!r} as in "
                                 f"{first.path} (every draw on one world, with one set of demo settings), got "
                                 f"{_at(got, field, where)!r}")


def _first_difference(a, b, prefix: str) -> str | None:
    """The dotted name of the first leaf where `a` and `b` differ (prefix itself for unequal leaves), else None.
    A key only one side holds is a setting the other's lace did not have yet, and is not compared."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [k for k in a if k in b]:
            found = _first_difference(a.get(key), b.get(key), f"{prefix}.{key}")
            if found is not None:
                return found
        return None
    return None if a == b else prefix


def _at(value, field: str, prefix: str):
    for key in field[len(prefix):].split(".")[1:]:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def pooled_figures(draws: Sequence[Draw], split: str, columns=FIGURES) -> dict[str, list[Pooled]]:
    """Per variant (base included, in the order the draws first name them), per column: the `Pooled` figure."""
    per_draw = [seed_values(draw.summary["evaluations"], split, columns) for draw in draws]
    variants = list(dict.fromkeys(variant for values in per_draw for variant in values))
    table = {}
    for variant in variants:
        row = []
        for c in range(len(columns)):
            runs = [values[variant][c] for values in per_draw if variant in values and values[variant][c]]
            pooled = [value for run in runs for value in run]
            spreads = [spread(run) for run in runs if len(run) > 1]
            row.append(Pooled(float(np.mean(pooled)) if pooled else None, spread([np.mean(run) for run in runs]),
                              float(np.mean(spreads)) if spreads else None, len(runs), len(pooled)))
        table[variant] = row
    return table


Means = Callable[[str, str], "float | None"]
"""get(variant, column name) -> the mean over draws x seeds on one split, or None when the variant was not run."""


def means(draws: Sequence[Draw], split: str) -> Means:
    table = pooled_figures(draws, split)

    def get(variant: str, column: str) -> float | None:
        return table[variant][COLUMN_NAMES.index(column)].mean if variant in table else None

    return get


def choose_best(draws: Sequence[Draw], best: str | None = None) -> tuple[str | None, str]:
    """The LACE arm the targets are checked for, and how it was chosen: `best` when given (a variant the draws
    ran), else the arm of role `best` (`lace.experiment.variants.ROLES`) with the best validation mean of
    image->text and text->image swap-attribute; None when no such arm was run."""
    run = list(dict.fromkeys(variant_of(model) for draw in draws for model in draw.summary["evaluations"]))
    if best is not None:
        if best not in run:
            raise input_error("demo draws", "best", f"a variant the runs fine-tuned, one of {run}", best)
        return best, "given"
    get = means(draws, "val")
    scores = {}
    for variant in (arm for arm in ROLES["best"] if arm in run):
        values = [get(variant, column) for column in SELECTION_COLUMNS]
        if None not in values:
            scores[variant] = float(np.mean(values))
    if not scores:
        return None, "no LACE arm of the role 'best' was run (name the arm with --best)"
    chosen = max(scores, key=scores.get)
    return chosen, "validation mean of i2t and t2i swap-attribute: " + ", ".join(
        f"{variant} {score:.3f}" for variant, score in sorted(scores.items(), key=lambda item: -item[1]))


BINDING_TARGETS = tuple(
    difference(f"{{best}} beats {{plain}} by >= 10 points on {column}", column, "best", "plain", ">=", 0.10)
    for column in SWAP_FAMILIES) + (
    difference("{best} >= {text_only} on t2i swap-att", "t2i swap-att", "best", "text_only"),
) + tuple(difference(f"{{best}} keeps {column} within 2 points of {{plain}}", column, "best", "plain", ">=", -0.02)
          for column in ("R@1 i2t", "R@1 t2i")) + tuple(
    difference(f"{{best}} beats {{text_only}} by >= 10 points on {column} (held-out colour-shape pairs)", column,
               "best", "text_only", ">=", 0.10, "test_comp") for column in SELECTION_COLUMNS) + tuple(
    difference(f"no interference: {{best_with_text_only}} beats {{text_only}} by >= 3 points on {column}", column,
               "best_with_text_only", "text_only", ">=", 0.03, split)
    for split in ("test", "test_comp") for column in SWAP_FAMILIES) + (
    gap_share("the best LACE arm closes >= 3/4 of the gap between plain and the ceiling on t2i swap-att",
              "t2i swap-att", "best", "plain", "ceiling", 0.75),
)
"""The pre-registered targets on the benchmark figures, over draws x seeds."""


def training_targets(best: str | None) -> tuple[Target, ...]:
    """The editor's valid rows kept over training, and the provenance figures of the best arm: the figure of the
    editor's rows is the pairs layout's where the arm trains on edited rows."""
    rows = "pair_rows_valid" if best is not None and VARIANTS[best].get("edited_image_rows") else \
        "image_negatives_valid_rows"
    return (
        Target(f"editor: {rows} of {{best}} at the last logged step >= 90% of the first's", rows,
               (("best", 1.0, f"{rows} last"), ("best", -0.9, f"{rows} first")), ">=", 0.0, "train"),
        Target("provenance: the edited captions of {best} prefer their edited image >= half the time at the end",
               f"{PREFERS_EDITED} last", (("best", 1.0),), ">=", 0.5, "train"),
        Target(f"provenance: real-vs-edited probe AUC of {{best}} <= {PROBE_AUC_LIMIT} (local edits of test images)",
               "probe_auc", (("best", 1.0),), "<=", PROBE_AUC_LIMIT, "test"),
    )


def _logged(draws: Sequence[Draw], variant: str, figure: str) -> list[tuple[float, float]]:
    """(first, last) logged value of `figure` in each fine-tune of `variant` whose metrics.jsonl logs it."""
    found = []
    for draw in draws:
        for model in draw.summary["evaluations"]:
            if variant_of(model) != variant:
                continue
            path = finetune_folder(draw.folder_of(model), variant, int(model.rsplit(" seed ", 1)[1])) / "metrics.jsonl"
            if not path.is_file():
                continue
            values = [row[figure] for row in map(json.loads, path.read_text().splitlines()) if figure in row]
            if values:
                found.append((float(values[0]), float(values[-1])))
    return found


def draw_samples(draws: Sequence[Draw]) -> Samples:
    """samples(arm, figure, split) over every draw: a benchmark figure of the demo's tables, `<logged> first` or
    `<logged> last` (a fine-tune's metrics.jsonl), or `probe_auc` (the demo's provenance stage)."""

    def samples(variant: str, figure: str, split: str) -> list[Run]:
        if figure in COLUMNS:
            return [run for draw in draws for run in runs_of(draw.summary["evaluations"], variant, figure, split)]
        if figure == "probe_auc":
            return [Run(figures["local"]["probe_auc"]) for draw in draws
                    for model, figures in draw.summary.get("provenance", {}).items()
                    if variant_of(model) == variant and model != "base"
                    and figures["local"].get("probe_auc") is not None]
        logged, end = figure.rsplit(" ", 1)
        return [Run(pair[0 if end == "first" else 1]) for pair in _logged(draws, variant, logged)]

    return samples


def check_draw_targets(draws: Sequence[Draw], best: str | None) -> list[Verdict]:
    """Every target checked on the draws, the arms picked by role (`best` as chosen)."""
    samples, pooled = draw_samples(draws), {split: means(draws, split) for split in DRAW_SPLITS}
    ran = list(dict.fromkeys(variant_of(model) for draw in draws for model in draw.summary["evaluations"]))
    arms = assign_roles(ran, choose_by_figures(lambda arm, figure, split: pooled[split](arm, figure)))
    arms["best"] = best  # as `choose_best` chose it (or as given)
    twin = with_caption_negatives(best) if best is not None else None
    arms["best_with_text_only"] = twin if twin in ran else None
    return [check(target, arms, samples) for target in BINDING_TARGETS + training_targets(best)]


def combine_draws(draws: Sequence[Draw], best: str | None = None) -> dict:
    """Everything the draws report holds: the runs, the best arm and how it was chosen, every pooled figure of
    every split, and the targets."""
    chosen, how = choose_best(draws, best)
    return {
        "runs": [path.parent.name for draw in draws for path in draw.paths],  # run folders by name: no machine paths
        "base_seeds": [draw.base_seed for draw in draws],
        "world": draws[0].summary["world"],
        "best": {"variant": chosen, "chosen_by": how},
        "figures": {split: {variant: {COLUMN_NAMES[c]: asdict(cell) for c, cell in enumerate(row)}
                            for variant, row in pooled_figures(draws, split).items()} for split in DRAW_SPLITS},
        "targets": [verdict.record() for verdict in check_draw_targets(draws, chosen)],
    }


def _cell(figure: dict) -> str | None:
    if figure["mean"] is None:
        return None
    spreads = " ".join(f"±{figure[name]:.3f}" if figure[name] is not None else "±—"
                       for name in ("across_draws", "across_seeds"))
    return f"{figure['mean']:.3f} {spreads}"


def _interval(interval: list | None) -> str:
    """"[lo, hi]" of a verdict's record ("-inf" where every resample lacked a gap to close); "" without one."""
    ends = ["-inf" if end is None else f"{end:+.3f}" for end in interval or ()]
    return f"[{', '.join(ends)}]" if ends else ""


def draws_report(result: dict) -> Report:
    """The markdown/HTML report of `combine_draws`'s result: targets first, then every split's tables."""
    report = Report("LACE over base draws")
    report.paragraph(
        f"{len(result['runs'])} demo runs on one world, {len(result['base_seeds'])} base draws (pretraining seeds "
        f"{', '.join(map(str, result['base_seeds']))}), each with its fine-tune seeds: " + ", ".join(result["runs"])
        + ". Cells: mean over base draws x seeds, ± the spread across base draws (sample std of the per-draw means), "
        "± the spread across fine-tune seeds (mean of the within-draw sample stds); — where a spread has one value.")
    best = result["best"]
    report.heading("Pre-registered targets")
    report.paragraph(f"Best LACE arm: {best['variant'] or 'none'} ({best['chosen_by']}). Means over draws x seeds; "
                     "a target whose arms were not run reads 'not run'. " + VERDICT_NOTE)
    report.table(Table(["target", "split", "result", "margin", "95% interval", "n", "figures"], [
        [t["text"], t["split"], t["status"], t["margin"],
         _interval(t.get("interval")), t.get("n", ""),
         t["evidence"]] for t in result["targets"]],
        caption="margin and interval: the compared quantity (a difference in the figure's units, or a share of a gap) "
                "against its threshold; margin + past it, - short of it"))
    names = {"test": "in-distribution test", "test_comp": "compositional test (held-out colour-shape pairs)",
             "val": "validation"}
    for split in DRAW_SPLITS:
        for title, columns in (("Binding", BINDING_COLUMNS), ("Retrieval and geometry", GEOMETRY_COLUMNS)):
            report.heading(f"{title}, {names[split]}")
            rows = [[variant] + [_cell(figures[column[0]]) for column in columns]
                    for variant, figures in result["figures"][split].items()]
            report.table(Table(["model"] + [column[0] for column in columns], rows,
                               caption="mean ±across base draws ±across fine-tune seeds"))
    return report


def summary_table(result: dict) -> Table:
    """The headline figures of the test split, for the terminal."""
    rows = [[variant] + [_cell(figures[column[0]]) for column in SUMMARY_COLUMNS]
            for variant, figures in result["figures"]["test"].items()]
    return Table(["model"] + [column[0] for column in SUMMARY_COLUMNS], rows, caption="test split")


def write_draws(result: dict, out: str | Path, overwrite: bool = False) -> tuple[Path, Path]:
    """`out` (.md) and the .json beside it, atomically; refused where either exists, unless `overwrite`."""
    markdown = Path(out)
    if markdown.suffix != ".md":
        raise input_error("demo draws", "out", "a markdown file name ending in .md (the figures go beside it as .json)",
                          str(out))
    data = markdown.with_suffix(".json")
    for path in (markdown, data):
        if path.exists() and not overwrite:
            raise LaceInputError(f"{path}: exists; pass --overwrite to replace it")
        if path.is_dir():
            raise LaceInputError(f"{path}: expected a file path, found a folder")
    atomic_write_json(data, result)
    atomic_write_text(markdown, draws_report(result).markdown(markdown.parent))
    return markdown, data
