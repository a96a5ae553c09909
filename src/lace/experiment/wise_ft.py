"""The WiSE-FT stage: exported fine-tunes mixed back into their base at a few alphas, each mix scored on
zero-shot and on a binding benchmark (`lace.report.wise_ft.wise_ft_tradeoff`), as figures a report can read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from lace.eval.runner import EvalConfig
from lace.io import read_json
from lace.report.wise_ft import BINDING_METRIC, wise_ft_tradeoff
from lace.train.wise_ft import read_state_dict

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _quick_gelu(path: Path) -> bool:
    """What the export's side JSON records (absent: GELU)."""
    side = Path(f"{path}.json")
    return bool(side.is_file() and read_json(side).get("quick_gelu"))


def wise_ft_stage(
    model: str, base_path: str | Path, finetuned_paths: Mapping[str, str | Path], config: EvalConfig,
    png: str | Path, alphas: Sequence[float] = ALPHAS, binding_metric: tuple[str, str] = BINDING_METRIC,
) -> dict:
    """{"alphas", "binding_metric", "figure" (png name), "points"}: one point per (fine-tune label, alpha)
    with `model`, `alpha`, `zeroshot/top1` (mean over tasks), per-task top-1 and the binding metric."""
    base_path = Path(base_path)
    states = {label: read_state_dict(path) for label, path in finetuned_paths.items()}
    points, figure = wise_ft_tradeoff(model, read_state_dict(base_path), states, alphas, config, png,
                                      quick_gelu=_quick_gelu(base_path), binding_metric=binding_metric)
    return {"alphas": [float(alpha) for alpha in alphas], "binding_metric": "/".join(binding_metric),
            "figure": Path(figure).name, "points": points}
