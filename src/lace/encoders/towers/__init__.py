"""`lace-towers`: pretrained EfficientNet-Lite0 and all-MiniLM-L6-v2 towers with trainable heads.

`load_encoder("lace-towers", pretrained=None)` gives fresh heads; `pretrained` may
name a heads checkpoint (`save_heads_checkpoint`) or an exported full state dict. The names below are the
towers' public face: the studies use these, not the modules behind them.
"""

from __future__ import annotations

import torch

from lace.encoders.registry import register_encoder
from lace.encoders.towers.checkpoint import (
    load_towers_checkpoint,
    read_checkpoint,
    save_heads_checkpoint,
)
from lace.encoders.towers.features import cached_image_tower_features, cached_text_tower_features
from lace.encoders.towers.model import MODEL_NAME, TowersConfig, TowersDualEncoder
from lace.encoders.towers.top import TowersTop, save_top_checkpoint
from lace.encoders.towers.top_features import (
    TokenStates,
    cached_image_top_features,
    cached_text_top_features,
    encode_captions,
    fresh_token_states,
)


@register_encoder(MODEL_NAME)
def load_towers(pretrained: str | None = None, device: str | torch.device = "cpu") -> TowersDualEncoder:
    """Fresh heads (`pretrained` None or "none") or the heads of a checkpoint file."""
    if pretrained is None or str(pretrained).lower() == "none":
        return TowersDualEncoder(TowersConfig()).to(device)
    return load_towers_checkpoint(pretrained, device=device)


__all__ = ["TokenStates", "TowersConfig", "TowersDualEncoder", "TowersTop", "cached_image_top_features",
           "cached_image_tower_features", "cached_text_top_features", "cached_text_tower_features", "encode_captions",
           "fresh_token_states", "load_towers", "load_towers_checkpoint", "read_checkpoint", "save_heads_checkpoint", "save_top_checkpoint"]
