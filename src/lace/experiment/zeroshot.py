"""Zero-shot classification of one model, as the demo and the study run it before and after every fine-tune.

One call per model (not per split): `lace eval --benchmarks zeroshot` on a world's built-in
tasks (shape, colour, count) or on an image folder with one subfolder per class.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from lace.data.world.zeroshot import ensure_zeroshot_tasks
from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.eval.runner import EvalConfig, run_evaluation
from lace.io import atomic_write_bytes
from lace.manifest import MANIFEST, add_to_manifest

MEAN_TOP1 = "mean over tasks/top1"


def zeroshot_top1(benchmarks: dict) -> float:
    """Mean top-1 accuracy over the zero-shot tasks of one results dict (`<task>/top1`)."""
    values = [value for key, value in benchmarks.get("zeroshot", {}).items() if key.endswith("/top1")]
    if not values or any(value is None for value in values):
        raise LaceInputError("zero-shot results without top-1 figures: evaluate with --benchmarks zeroshot")
    return float(np.mean(values))


def zeroshot_figures(encoder: DualEncoder, name: str, config: EvalConfig) -> dict[str, float | None]:
    """`<task>/top1`, `<task>/top5` and `<task>/mean_per_class_recall` of `encoder` on the zero-shot tasks
    `config` points at (`world` or `zeroshot_root`), and `MEAN_TOP1` over the tasks; NaN figures (top-5
    with < 5 classes) become None."""
    config = dataclasses.replace(config, benchmarks=("zeroshot",), diagnostics=False)
    figures = run_evaluation(encoder, config, model=name)["benchmarks"]["zeroshot"]
    figures = {key: (None if value is None or math.isnan(value) else float(value)) for key, value in figures.items()}
    return {**figures, MEAN_TOP1: zeroshot_top1({"zeroshot": figures})}


def folder_zeroshot(encoder: DualEncoder, name: str, config) -> dict[str, float | None]:
    """`zeroshot/<task>/*` figures (`zeroshot_figures`) of `encoder` on the user's image folder of a ground's
    `config` (its `zeroshot_root`, `zeroshot_classnames` and `zeroshot_templates`); empty without a folder."""
    if not config.zeroshot_root:
        return {}
    folder = EvalConfig(benchmarks=("zeroshot",), zeroshot_root=config.zeroshot_root,
                        zeroshot_classnames=config.zeroshot_classnames, zeroshot_templates=config.zeroshot_templates)
    return {f"zeroshot/{key}": value for key, value in zeroshot_figures(encoder, name, folder).items()}


def world_zeroshot_root(world_dir: str | Path, folder: str | Path, per_class: int = 20) -> Path:
    """`folder`, holding a copy of the world's `world.json` (listed in the folder's manifest) and its zero-shot tasks
    (written once), so that a world shared read-only between runs is never written to. Pass it as
    `EvalConfig.zeroshot_root`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source, copy = Path(world_dir) / "world.json", folder / "world.json"
    if not copy.is_file() or copy.read_bytes() != source.read_bytes() or not (folder / MANIFEST).is_file():
        atomic_write_bytes(copy, source.read_bytes())
        add_to_manifest(folder, ("world.json",))  # read back through `read_world_config`, which checks it
    ensure_zeroshot_tasks(folder, per_class)
    return folder
