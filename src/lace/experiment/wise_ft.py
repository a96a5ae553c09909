"""The WiSE-FT trade-off: exported fine-tunes mixed back into their base (`lace.train.wise_ft`) at a few alphas,
each mix scored on zero-shot and on a binding benchmark, and plotted as one curve per fine-tune
(`lace.report.plots.tradeoff_curves`); `wise_ft_stage` gives the figures a report reads."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from lace.encoders import load_encoder
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.runner import EvalConfig, run_evaluation
from lace.experiment.zeroshot import zeroshot_top1
from lace.io import atomic_write_json, read_json
from lace.report.plots import tradeoff_curves
from lace.train.wise_ft import interpolate_state_dicts, read_state_dict

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
BINDING_METRIC = ("world", "i2t/swap_attribute")
"""Default y axis: the world's image->text swap-attribute accuracy."""


def _quick_gelu(path: Path) -> bool:
    """What the export's side JSON records (absent: GELU)."""
    side = Path(f"{path}.json")
    return bool(side.is_file() and read_json(side).get("quick_gelu"))


def _evaluate_weights(model: str, state: dict[str, torch.Tensor], quick_gelu: bool, config: EvalConfig,
                      device: str, progress: bool, pixels: dict) -> dict:
    """Evaluate a state dict through the one loader every export goes through (side JSON included).

    `pixels`: decoded images shared by every mix (one architecture, one preprocess), filled here."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "weights.pt"
        torch.save(state, path)
        atomic_write_json(Path(folder) / "weights.pt.json", {"model": model, "quick_gelu": quick_gelu})
        encoder = load_encoder(model, str(path), device=device)
        cache = EmbeddingCache(encoder, batch_size=config.batch_size, progress=progress, pixels=pixels)
        return run_evaluation(encoder, config, model=model, progress=progress, cache=cache)


def wise_ft_tradeoff(
    model: str,
    base_state: dict[str, torch.Tensor],
    finetuned_states: Mapping[str, dict[str, torch.Tensor]],
    alphas: Sequence[float],
    config: EvalConfig,
    path: str | Path,
    quick_gelu: bool = False,
    binding_metric: tuple[str, str] = BINDING_METRIC,
    device: str = "cpu",
    progress: bool = False,
) -> tuple[list[dict], Path]:
    """Evaluate each fine-tune mixed with its base at every alpha and plot zero-shot against binding.

    Args:
        model: architecture name both state dicts belong to (e.g. `lace-micro-rn-32`).
        base_state: the base's state dict (export format).
        finetuned_states: label -> fine-tuned state dict of the same architecture.
        alphas: mixing weights in [0, 1] (0 = base, 1 = fine-tune).
        config: where the benchmarks are (`world`, or `zeroshot_root` and the binding benchmark's root);
            its benchmarks are replaced by zero-shot and the binding metric's, diagnostics off.
        path: the PNG to write.
        quick_gelu: the architecture's weights need QuickGELU (as the export's side JSON says).
        binding_metric: (benchmark, metric) on the y axis.

    Returns:
        (points, path): one dict per (label, alpha) with `model` (label), `alpha`, `zeroshot/top1`
        (mean over tasks), `zeroshot/<task>/top1` and `<benchmark>/<metric>`; the base (alpha 0) is
        evaluated once.
    """
    benchmark, metric = binding_metric
    config = dataclasses.replace(config, benchmarks=("zeroshot", benchmark), diagnostics=False)
    points, curves, base_figures = [], {}, None
    pixels: dict = {}  # each image is decoded once for every mix
    for label, finetuned in finetuned_states.items():
        curve = []
        for alpha in alphas:
            if alpha == 0.0 and base_figures is not None:
                figures = base_figures
            else:
                mixed = interpolate_state_dicts(base_state, finetuned, float(alpha))
                figures = _evaluate_weights(model, mixed, quick_gelu, config, device, progress, pixels)["benchmarks"]
                base_figures = figures if alpha == 0.0 else base_figures
            zeroshot, binding = zeroshot_top1(figures), figures[benchmark][metric]
            per_task = {f"zeroshot/{key}": value for key, value in figures["zeroshot"].items() if key.endswith("/top1")}
            points.append({"model": label, "alpha": float(alpha), "zeroshot/top1": zeroshot, **per_task,
                           f"{benchmark}/{metric}": binding})
            curve.append((zeroshot, binding, f"{alpha:g}"))
        curves[label] = curve
    png = tradeoff_curves(curves, path, title=f"WiSE-FT: base mixed with each fine-tune ({model})",
                          xlabel="zero-shot top-1 (mean over tasks)", ylabel=f"{benchmark} {metric}")
    return points, png


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
