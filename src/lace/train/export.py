"""`export_run`: a trained run -> a plain state dict of the original architecture.

The written file holds only the architecture's own keys (for open_clip models, what
`open_clip.create_model(name, pretrained=path)` loads); the model name, provenance and
activation go to a side JSON (`<out>.json`), so nothing of LACE is needed to use the
model. `quick_gelu` there records that the run started from weights trained with
QuickGELU (OpenAI's); `lace` restores it on load, and open_clip users pass
`force_quick_gelu=True` (or use the `-quickgelu` architecture name).
"""

from __future__ import annotations

import io
from pathlib import Path

import torch
from safetensors.torch import save_file

from lace.encoders import load_encoder
from lace.encoders.open_clip_encoder import quick_gelu_for
from lace.encoders.weights import RUN_CONFIG, TRAINED, resolve_pretrained
from lace.errors import LaceInputError
from lace.io import atomic_path, atomic_write_bytes, atomic_write_json, check_output_file, read_json
from lace.train import checkpoints
from lace.train.wise_ft import check_same_architecture, interpolate_state_dicts, read_state_dict


def export_run(
    run_dir: str | Path, out: str | Path, checkpoint: str = "latest", overwrite: bool = False,
    interpolate: float | None = None, base: str | Path | None = None,
) -> Path:
    """Write the weights of `run_dir`'s checkpoint (default: latest) to `out`.

    `out` ending in `.safetensors` is written with safetensors, anything else with
    `torch.save` (a plain dict of tensors). With `interpolate` = alpha and a `base`
    checkpoint of the same architecture (and activation), writes the WiSE-FT mix
    `(1 - alpha) base + alpha fine-tune` instead (`lace.train.wise_ft`); the side JSON
    records `interpolation` (`alpha`, `base`). Returns `out`.
    """
    run_dir, out = Path(run_dir), check_output_file(out, overwrite, what="export")
    if (interpolate is None) != (base is None):
        raise LaceInputError("--interpolate ALPHA and --base CHECKPOINT go together (WiSE-FT needs both)")
    if interpolate is not None and not 0.0 <= interpolate <= 1.0:
        raise LaceInputError(f"--interpolate: expected alpha in [0, 1] (0 = base, 1 = fine-tune), got {interpolate}")
    config = read_json(run_dir / RUN_CONFIG)
    if not isinstance(config, dict) or "model" not in config:
        raise LaceInputError(f"{run_dir / RUN_CONFIG}: field 'model': expected the run's model name")
    manifest = checkpoints.resolve_checkpoint(run_dir, checkpoint)
    loaded = checkpoints.load_checkpoint(manifest, run_dir)
    encoder = load_encoder(config["model"], None, device="cpu")
    encoder.load_state_dict(loaded.weights)
    state = {key: value.contiguous() for key, value in encoder.export_state_dict().items()}
    quick_gelu = quick_gelu_for(config["model"], config.get("pretrained")) or getattr(encoder, "quick_gelu", False)
    record = {
        "model": config["model"], "pretrained": config.get("pretrained"), "run": str(run_dir),
        "checkpoint": manifest.stem, "step": loaded.step, "quick_gelu": quick_gelu,
    }
    if interpolate is not None:
        state = _interpolated(state, Path(base), float(interpolate), config["model"], quick_gelu)
        record["interpolation"] = {"alpha": float(interpolate), "base": str(base)}
    if out.suffix == ".safetensors":
        with atomic_path(out) as tmp:
            save_file(state, str(tmp))
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write_bytes(out, buffer.getvalue())
    atomic_write_json(out.with_name(out.name + ".json"), record)
    return out


def _interpolated(
    finetuned: dict[str, torch.Tensor], base: Path, alpha: float, model: str, quick_gelu: bool
) -> dict[str, torch.Tensor]:
    """The WiSE-FT mix of the run's weights with `base` (a checkpoint file or a pretrained tag), refused
    unless `base` is the same model and activation."""
    side = base.with_name(base.name + ".json")
    record = read_json(side) if side.is_file() else {}
    if isinstance(record, dict) and record.get("model") not in (None, model):
        raise LaceInputError(f"{side}: field 'model': the base is {record['model']!r}, the run is {model!r}; "
                             "WiSE-FT mixes two checkpoints of one architecture")
    base_quick_gelu = quick_gelu_for(model, str(base))
    if base_quick_gelu != bool(quick_gelu):
        raise LaceInputError(f"{base}: the base uses {'QuickGELU' if base_quick_gelu else 'GELU'}, the run "
                             f"{'QuickGELU' if quick_gelu else 'GELU'}; their weights cannot be mixed")
    # a plain state dict is read as it is; a run, a training checkpoint or a tag (e.g. openai) is loaded as a model
    plain = base.is_file() and resolve_pretrained(str(base)).kind not in TRAINED
    base_state = read_state_dict(base) if plain else load_encoder(model, str(base)).export_state_dict()
    check_same_architecture(base_state, finetuned, base_name=str(base), finetuned_name=f"the run's {model}")
    return interpolate_state_dicts(base_state, finetuned, alpha)
