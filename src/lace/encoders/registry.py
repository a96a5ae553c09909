"""`load_encoder`: the one front door from a model name and its weights to a `DualEncoder`.

Names are resolved by prefix, in order: `hf-clip:` (transformers CLIPModel), `hf-siglip:`
(transformers SiglipModel), names
registered with `register_encoder` (for example `lace-towers`), then open_clip. What `pretrained`
names (a run, a training checkpoint, an export, a Hugging Face folder, a tag) is decided from the file
by `lace.encoders.weights.resolve_pretrained`.

Each family's module is imported when a model of it is first asked for, not with this one: a run of an
open_clip model does not import the towers, and a Hugging Face or towers model does not import open_clip.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from lace.encoders.base import DualEncoder
from lace.encoders.names import HF_PREFIX, HF_SIGLIP_PREFIX
from lace.encoders.weights import TRAINED, Weights, resolve_pretrained
from lace.errors import LaceInputError
from lace.io import read_safetensors
from lace.manifest import sha256_file, verification_enabled

EncoderFactory = Callable[..., DualEncoder]
_FACTORIES: dict[str, EncoderFactory] = {}
BUILT_IN_NAMES = {"lace-towers": "lace.encoders.towers"}
"""Names lace registers itself -> the module whose import registers the name (imported on first use)."""
HF_PREFIXES = {"clip": HF_PREFIX, "siglip": HF_SIGLIP_PREFIX}
"""A Hugging Face folder's `model_type` -> the model prefix that loads it."""


def register_encoder(name: str) -> Callable[[EncoderFactory], EncoderFactory]:
    """Register `factory(pretrained, device) -> DualEncoder` under a model name."""
    def decorator(factory: EncoderFactory) -> EncoderFactory:
        _FACTORIES[name] = factory
        return factory
    return decorator


def load_encoder(
    model: str, pretrained: str | None = None, device: str | torch.device = "cpu"
) -> DualEncoder:
    """Build the dual encoder called `model` with the weights `pretrained` names.

    Args:
        model: an open_clip architecture (`ViT-B-32`, `ViT-B-16-SigLIP2`, `lace-tiny`), `hf-clip:<dir or hub
            id>`, `hf-siglip:<dir or hub id>`, or a registered name such as `lace-towers`.
        pretrained: a `lace train` run folder (its latest whole checkpoint), a training checkpoint, an export
            or state dict file, a Hugging Face model folder (with `--model hf-clip` / `hf-siglip`), an open_clip
            tag, or None/"none" for random init.
    """
    weights = resolve_pretrained(pretrained)
    model = _model_for(model, weights)
    factory = _registered(model)
    if weights.kind in TRAINED and factory is None:
        return _with_trained_weights(model, weights, device)
    if model.startswith((HF_PREFIX, HF_SIGLIP_PREFIX)):
        return _hf_loader(model)(model, device=device)
    if factory is not None:
        return factory(pretrained=weights.open_clip_value, device=device)
    from lace.encoders.open_clip_encoder import load_open_clip

    return load_open_clip(model, pretrained=weights.open_clip_value, device=device)


def _registered(model: str) -> EncoderFactory | None:
    """The factory registered under `model` (a built-in name's module imported first), or None."""
    if model not in _FACTORIES and model in BUILT_IN_NAMES:
        importlib.import_module(BUILT_IN_NAMES[model])
    return _FACTORIES.get(model)


def _hf_loader(model: str) -> EncoderFactory:
    """The loader of a `hf-clip:` or `hf-siglip:` model name."""
    from lace.encoders.hf_encoder import load_hf_clip, load_hf_siglip

    return load_hf_siglip if model.startswith(HF_SIGLIP_PREFIX) else load_hf_clip


def _model_for(model: str, weights: Weights) -> str:
    """`model`, checked against the model the weights record; a Hugging Face folder gives its own source."""
    if weights.kind == "hf folder":
        prefix = HF_PREFIXES.get((weights.hf_type or "").split("_")[0])
        if prefix is None:
            raise LaceInputError(f"{weights.path}: a Hugging Face folder of model_type {weights.hf_type!r}; lace "
                                 f"loads CLIP and SigLIP models ({', '.join(HF_PREFIXES)})")
        if model.rstrip(":") not in (prefix.rstrip(":"), f"{prefix}{weights.path}", f"{prefix}{weights.given}"):
            raise LaceInputError(f"{weights.given}: a Hugging Face {weights.hf_type} folder, not weights of "
                                 f"--model {model!r}; pass --model {prefix.rstrip(':')} (or {prefix}{weights.given})")
        return f"{prefix}{weights.path}"
    if weights.model is not None and weights.model != model:
        raise LaceInputError(f"{weights.given}: {'an' if weights.kind == 'export' else 'a'} {weights.kind} of "
                             f"{weights.model!r}, not of --model {model!r}")
    return model


def _with_trained_weights(model: str, weights: Weights, device: str | torch.device) -> DualEncoder:
    """`model` built afresh (with the activation its run started with), then given a training checkpoint's
    `DualEncoder` state dict."""
    if model.startswith((HF_PREFIX, HF_SIGLIP_PREFIX)):
        encoder = load_encoder(model, None, device="cpu")
    else:
        from lace.encoders.open_clip_encoder import load_open_clip, quick_gelu_for

        encoder = load_open_clip(model, None, device="cpu", quick_gelu=quick_gelu_for(model, weights.origin))
    if weights.sha256 is not None and verification_enabled() and sha256_file(weights.path) != weights.sha256:
        raise LaceInputError(f"{weights.path}: checkpoint is damaged (its SHA-256 does not match its manifest)")
    state = read_safetensors(weights.path)
    try:
        encoder.load_state_dict(state)
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LaceInputError(f"{weights.path}: a {weights.kind} whose tensors do not fit {model} ({first})") from error
    return encoder.to(device)
