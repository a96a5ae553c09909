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
from lace.errors import LaceInputError
from lace.io import atomic_path, atomic_write_bytes, atomic_write_json, read_json
from lace.train import checkpoints
from lace.train.loop import CONFIG_FILE


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str = "latest", overwrite: bool = False) -> Path:
    """Write the weights of `run_dir`'s checkpoint (default: latest) to `out`.

    `out` ending in `.safetensors` is written with safetensors, anything else with
    `torch.save` (a plain dict of tensors). Returns `out`.
    """
    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and not overwrite:
        raise LaceInputError(f"{out}: file exists; pass --overwrite to replace it")
    config = read_json(run_dir / CONFIG_FILE)
    if not isinstance(config, dict) or "model" not in config:
        raise LaceInputError(f"{run_dir / CONFIG_FILE}: field 'model': expected the run's model name")
    manifest = checkpoints.resolve_checkpoint(run_dir, checkpoint)
    loaded = checkpoints.load_checkpoint(manifest, run_dir)
    encoder = load_encoder(config["model"], None, device="cpu")
    encoder.load_state_dict(loaded.weights)
    state = {key: value.contiguous() for key, value in encoder.export_state_dict().items()}
    if out.suffix == ".safetensors":
        with atomic_path(out) as tmp:
            save_file(state, str(tmp))
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write_bytes(out, buffer.getvalue())
    atomic_write_json(out.with_name(out.name + ".json"), {
        "model": config["model"], "pretrained": config.get("pretrained"), "run": str(run_dir),
        "checkpoint": manifest.stem, "step": loaded.step,
        "quick_gelu": quick_gelu_for(config["model"], config.get("pretrained")) or getattr(encoder, "quick_gelu", False),
    })
    return out
