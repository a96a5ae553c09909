"""`lace-towers`: pretrained EfficientNet-Lite0 and all-MiniLM-L6-v2 towers with trainable heads.

`load_encoder("lace-towers", pretrained=None)` gives fresh heads; `pretrained` may
name a heads checkpoint (`save_heads_checkpoint`) or an exported full state dict.
"""

from __future__ import annotations

import torch

from lace.encoders.registry import register_encoder
from lace.encoders.towers.checkpoint import load_towers_checkpoint, save_heads_checkpoint
from lace.encoders.towers.model import MODEL_NAME, TowersConfig, TowersDualEncoder


@register_encoder(MODEL_NAME)
def load_towers(pretrained: str | None = None, device: str | torch.device = "cpu") -> TowersDualEncoder:
    """Fresh heads (`pretrained` None or "none") or the heads of a checkpoint file."""
    if pretrained is None or str(pretrained).lower() == "none":
        return TowersDualEncoder(TowersConfig()).to(device)
    return load_towers_checkpoint(pretrained, device=device)


__all__ = ["TowersConfig", "TowersDualEncoder", "load_towers", "load_towers_checkpoint", "save_heads_checkpoint"]
