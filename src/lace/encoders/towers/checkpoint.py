"""Checkpoints of `lace-towers`: the trained parts (heads, logit scale, unlocked tower blocks).

A heads checkpoint is one safetensors file. Its metadata holds the `TowersConfig`
(`towers_config`, JSON) and the unlocked block counts (`unlocked_blocks`, JSON);
its tensors are keyed as in `TowersDualEncoder.state_dict()`. The full state dict
from `export_state_dict()` (safetensors, or a `torch.save`d dict) loads the same way.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.errors import LaceInputError
from lace.io import atomic_path

HEAD_PREFIXES = ("image_head.", "text_head.", "_logit_scale")


def trained_state_dict(encoder: TowersDualEncoder) -> dict[str, torch.Tensor]:
    """Heads, logit scale and the tensors of unlocked tower blocks (all that training can change)."""
    trainable = {name for name, parameter in encoder.named_parameters() if parameter.requires_grad}
    return {
        key: value.detach().cpu().contiguous()
        for key, value in encoder.state_dict().items()
        if key.startswith(HEAD_PREFIXES) or key in trainable
    }


def save_heads_checkpoint(encoder: TowersDualEncoder, path: str | Path) -> Path:
    """Write `trained_state_dict(encoder)` and its config to one safetensors file, atomically."""
    path = Path(path)
    metadata = {
        "format": "lace-towers-heads",
        "towers_config": json.dumps(dataclasses.asdict(encoder.config)),
        "unlocked_blocks": json.dumps(list(encoder.unlocked_blocks)),
        "tower_ids": json.dumps(encoder.tower_ids),
    }
    with atomic_path(path) as tmp:
        save_file(trained_state_dict(encoder), str(tmp), metadata=metadata)
    return path


def _config_from_tensors(tensors: dict[str, torch.Tensor], path: Path) -> TowersConfig:
    """Infer the head shapes of a checkpoint written without metadata."""
    weights = sorted(key for key in tensors if key.startswith("image_head.layers.") and key.endswith(".weight"))
    if not weights:
        raise LaceInputError(f"{path}: expected lace-towers head tensors 'image_head.layers.*.weight'")
    last = tensors[weights[-1]]
    hidden = tensors[weights[0]].shape[0] if len(weights) > 1 else 0
    return TowersConfig(embed_dim=int(last.shape[0]), head_hidden_dim=int(hidden))


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file or a `torch.save`d state dict."""
    path = Path(path)
    if not path.is_file():
        raise LaceInputError(f"{path}: lace-towers checkpoint not found (--pretrained)")
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as handle:
            keys = handle.keys()  # safe_open is not iterable
            return {key: handle.get_tensor(key) for key in keys}, dict(handle.metadata() or {})
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        raise LaceInputError(f"{path}: not a safetensors file or a torch state dict ({error})") from error
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise LaceInputError(f"{path}: expected a state dict of tensors")
    return tensors, {}


def load_towers_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> TowersDualEncoder:
    """Build a `TowersDualEncoder` from a heads checkpoint or a full exported state dict."""
    path = Path(path)
    tensors, metadata = read_checkpoint(path)
    missing_heads = [p for p in HEAD_PREFIXES if not any(k.startswith(p) for k in tensors)]
    if missing_heads:
        raise LaceInputError(f"{path}: not a lace-towers checkpoint; expected tensors under {missing_heads}")
    try:
        config = (TowersConfig(**json.loads(metadata["towers_config"])) if "towers_config" in metadata
                  else _config_from_tensors(tensors, path))
        unlocked = tuple(json.loads(metadata.get("unlocked_blocks", "[0, 0]")))
    except (TypeError, ValueError) as error:
        raise LaceInputError(f"{path}: metadata 'towers_config': {error}") from error
    encoder = TowersDualEncoder(config)
    expected = encoder.state_dict()
    unknown = sorted(set(tensors) - set(expected))
    wrong = [key for key in tensors if key in expected and tensors[key].shape != expected[key].shape]
    if unknown or wrong:
        raise LaceInputError(
            f"{path}: tensors that do not fit lace-towers {config}: unknown {unknown[:5]}, wrong shape {wrong[:5]}"
        )
    encoder.load_state_dict(tensors, strict=False)
    encoder.unlock_top_blocks(*unlocked)
    return encoder.to(device)
