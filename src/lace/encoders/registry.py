"""`load_encoder`: the one front door from a model name to a `DualEncoder`.

Names are resolved by prefix, in order: `hf-clip:` (transformers CLIPModel), `hf-siglip:`
(transformers SiglipModel), names
registered with `register_encoder` (for example `lace-towers`), then open_clip.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lace.encoders.base import DualEncoder
from lace.encoders.hf_encoder import HF_PREFIX, HF_SIGLIP_PREFIX, load_hf_clip, load_hf_siglip
from lace.encoders.open_clip_encoder import load_open_clip

EncoderFactory = Callable[..., DualEncoder]
_FACTORIES: dict[str, EncoderFactory] = {}


def register_encoder(name: str) -> Callable[[EncoderFactory], EncoderFactory]:
    """Register `factory(pretrained, device) -> DualEncoder` under a model name."""
    def decorator(factory: EncoderFactory) -> EncoderFactory:
        _FACTORIES[name] = factory
        return factory
    return decorator


def load_encoder(
    model: str, pretrained: str | None = None, device: str | torch.device = "cpu"
) -> DualEncoder:
    """Build the dual encoder called `model`.

    Args:
        model: an open_clip architecture (`ViT-B-32`, `ViT-B-16-SigLIP2`, `lace-tiny`), `hf-clip:<dir or hub
            id>`, `hf-siglip:<dir or hub id>`, or a registered name such as `lace-towers`.
        pretrained: open_clip tag, checkpoint path, or None/"none" for random init.
    """
    if model.startswith(HF_PREFIX):
        return load_hf_clip(model, device=device)
    if model.startswith(HF_SIGLIP_PREFIX):
        return load_hf_siglip(model, device=device)
    if model in _FACTORIES:
        return _FACTORIES[model](pretrained=pretrained, device=device)
    return load_open_clip(model, pretrained=pretrained, device=device)
