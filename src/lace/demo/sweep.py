"""`lace demo --sweep GRID`: LACE's knobs tried one at a time on the demo's base, scored on validation.

Every setting is a named set of `DemoConfig` overrides, by flag name (`n_edits`, `atoms`, or `edit: {...}` for
the `--edit-*` flags). Each runs in its own folder under
`<out>/sweep/`, seeded with the main run's world, base and dictionary, so only what the
setting changes is recomputed (a new dictionary when `atoms` or `sparsity` change, then the
LACE fine-tune and its evaluation). Settings are compared on the validation split only:
that is where hyper-parameters are chosen.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from lace.config import flags_as_fields, with_changes
from lace.demo.config import DemoConfig
from lace.demo.pipeline import run_demo
from lace.demo.report import BINDING_COLUMNS, GEOMETRY_COLUMNS, aggregate
from lace.errors import LaceInputError, input_error
from lace.io import atomic_write_json, read_json
from lace.manifest import entry_manifest
from lace.report.document import Report, Table

SWEEP_COLUMNS = (
    BINDING_COLUMNS[0], BINDING_COLUMNS[1], BINDING_COLUMNS[6], BINDING_COLUMNS[7], BINDING_COLUMNS[12],
    GEOMETRY_COLUMNS[0], GEOMETRY_COLUMNS[1], GEOMETRY_COLUMNS[4], GEOMETRY_COLUMNS[6], GEOMETRY_COLUMNS[9],
)
SHARED_STAGES = ("world", "base", "dictionary", "edit_retrieval", "eval base")
SWEEPABLE = {"atoms", "sparsity", "n_edits", "counterfactual_weight", "edit", "refresh_dictionary_every"}


def read_grid(path: str | Path) -> dict[str, dict]:
    """Named settings from a YAML mapping `name: {DemoConfig field or flag name: value}`; limited to LACE's knobs."""
    path = Path(path)
    try:
        grid = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise LaceInputError(f"{path}: cannot read the sweep grid ({error})") from error
    if not isinstance(grid, dict) or not grid:
        raise input_error(path, None, "a mapping of setting names to DemoConfig overrides", type(grid).__name__)
    for name, overrides in grid.items():
        if not isinstance(overrides, dict):
            raise input_error(path, str(name), "a mapping of DemoConfig fields to values", overrides)
        unknown = sorted(set(overrides) - SWEEPABLE)
        if unknown:
            raise input_error(path, f"{name}.{unknown[0]}", f"one of the LACE knobs {sorted(SWEEPABLE)}", unknown[0])
    return {str(name): {field: _tuples(value) for field, value in overrides.items()} for name, overrides in grid.items()}


def _tuples(value):
    """YAML lists as tuples, inside nested mappings (`edit: {kinds: [...]}`) too."""
    if isinstance(value, dict):
        return {key: _tuples(item) for key, item in value.items()}
    return tuple(value) if isinstance(value, list) else value


def _seed_folder(main: Path, folder: Path, stages: tuple[str, ...] = SHARED_STAGES) -> None:
    """Give `folder` the main run's world, base, dictionary and figures, so their `stages` are reused."""
    folder.mkdir(parents=True, exist_ok=True)
    world = folder / "world"
    if not world.exists():
        world.symlink_to((main / "world").resolve(), target_is_directory=True)  # read only once generated
    for relative in ("models/base.pt", "dictionary", "figures"):
        source, target = main / relative, folder / relative
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        # copies, not links: a setting with another dictionary size rewrites its own dictionary folder
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
    (folder / "stages").mkdir(exist_ok=True)
    for stage in stages:
        source = main / "stages" / f"{stage}.json"
        if source.is_file() and not (folder / "stages" / f"{stage}.json").exists():
            shutil.copy2(source, folder / "stages" / f"{stage}.json")
            if entry_manifest(source).is_file():  # with its manifest, so that the copy is checked on load
                shutil.copy2(entry_manifest(source), folder / "stages" / entry_manifest(source).name)


def run_sweep(config: DemoConfig, out: str | Path, grid: dict[str, dict], log=print) -> dict:
    """Run the main demo in `out` (cached), then every setting of `grid` as a LACE fine-tune.

    Returns {"settings": {name: overrides}, "evaluations": {label: results}}, also written to
    `<out>/sweep.json`, with the tables in `<out>/sweep.md` and `<out>/sweep.html`.
    """
    out = Path(out)
    decoded: dict = {}  # every setting trains on the same world's images
    main = run_demo(config, out, log=log, decoded=decoded)
    evaluations = {variant: results for variant, results in main["evaluations"].items() if variant != "base"}
    wall = {}
    for name, overrides in grid.items():
        setting = with_changes(config, flags_as_fields(DemoConfig, {**overrides, "only_variants": ("LACE",)}))
        folder = setting_folder(out, name)
        _seed_folder(out, folder)
        log(f"[sweep] {name}: {overrides}")
        summary = run_demo(setting, folder, log=log, decoded=decoded)
        for model, results in summary["evaluations"].items():
            if model != "base":
                evaluations[model.replace("LACE", f"LACE, {name}", 1)] = results
        wall[name] = sum(seconds for stage, seconds in summary["wall_seconds"].items()
                         if _own_stage(out, folder, stage))
    result = {"settings": grid, "evaluations": evaluations, "wall_seconds": wall}
    atomic_write_json(out / "sweep.json", result)
    sweep_report(result).write(out, stem="sweep")
    return result


def sweep_report(result: dict) -> Report:
    report = Report("LACE's knobs, one at a time (validation split)")
    report.paragraph("Each row changes one knob of the default LACE run; everything else is the main demo's "
                     "(same world, base, data order, steps and seeds). Hyper-parameters are chosen here, on "
                     "validation, never on the test splits.")
    rows = [[variant] + [mean for mean, _ in cells]
            for variant, cells in aggregate(result["evaluations"], "val", SWEEP_COLUMNS).items()]
    report.table(Table(["model"] + [c[0] for c in SWEEP_COLUMNS], rows,
                       caption="binding accuracy (chance 0.5), Winoground group, recall@1, hubness skewness of N10, "
                               "one-way rate, brittleness to counterfactual edits"))
    settings = [[name, ", ".join(f"{k} = {v}" for k, v in overrides.items()), result["wall_seconds"].get(name)]
                for name, overrides in result["settings"].items()]
    report.table(Table(["setting", "overrides", "seconds"], settings,
                       caption="settings and the wall time of the stages each ran itself (fine-tune, evaluation, "
                               "a new dictionary)"))
    return report


def _own_stage(main: Path, folder: Path, stage: str) -> bool:
    """Whether `folder` ran `stage` with other inputs than the main run (its time is the setting's cost)."""
    own, shared = folder / "stages" / f"{stage}.json", main / "stages" / f"{stage}.json"
    if not own.is_file():
        return False  # the report: not a stage
    return not shared.is_file() or read_json(own)["key"] != read_json(shared)["key"]


def reuse_run(main: str | Path, folder: str | Path) -> None:
    """Seed demo run `folder` with `main`'s world and base (`lace demo --reuse`); the rest is recomputed."""
    main = Path(main)
    if not (main / "stages" / "base.json").is_file():
        raise LaceInputError(f"{main}: not a demo run folder (no stages/base.json)")
    _seed_folder(main, Path(folder), ("world", "base"))


def setting_folder(out: str | Path, name: str) -> Path:
    """Where setting `name` of a sweep runs: `<out>/sweep/<name in lower case, runs of other characters as ->`."""
    return Path(out) / "sweep" / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
