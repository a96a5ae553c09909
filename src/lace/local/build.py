"""`build_local_editor`: the one front door to a fitted local image editor.

    editor = build_local_editor(LocalEditConfig(layer="layer1"), clip, pixels, captions, normalise, vocabulary)
    made = editor.negatives(clip, pixels, n_edits=2)   # (B, M, d) unit negatives with gradient, (B, M) valid
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.transforms import Normalize

from lace.concepts.vocabulary import Vocabulary
from lace.data.world.config import PALETTE
from lace.errors import input_error
from lace.local.config import LocalEditConfig
from lace.local.editor import LocalImageEditor, fit_local_editor, fit_recolour_editor
from lace.local.learnt import LearntRecolour
from lace.local.transport import GaussianTransport


def recolour_prototypes(vocabulary: Vocabulary, group: str) -> Tensor:
    """(G, 3) RGB in [0, 1] of the group's concepts, as the shapes world paints them; refused for a group
    whose names the world's palette does not know (the recolour operator needs each concept's colour)."""
    names = vocabulary.groups().get(group, [])
    unknown = [name for name in names if name not in PALETTE]
    if not names or unknown:
        raise input_error("local edit config", "operator",
                          f"mean_shift unless every {group} of the vocabulary is a shapes-world colour",
                          unknown or f"no {group} group")
    return torch.tensor([PALETTE[name] for name in names]).float() / 255.0


def build_local_editor(config: LocalEditConfig, clip: torch.nn.Module, pixels: Tensor, captions: list[list[str]],
                       normalise: Normalize, vocabulary: Vocabulary, seed: int = 0) -> LocalImageEditor:
    """The local image editor `config` describes, fitted on (N, 3, H, W) model-input pixels and each image's captions.

    clip: the open_clip model whose image tower is edited (left in the train/eval mode it had).
    """
    config.validate()
    was_training = clip.training
    clip.eval()
    try:
        if config.operator in ("recolour", "learnt"):
            prototypes = recolour_prototypes(vocabulary, config.group)
            std, mean = (torch.tensor(values, device=pixels.device).view(1, 3, 1, 1)
                         for values in (normalise.std, normalise.mean))
            raw = pixels * std + mean
            operator = LearntRecolour(config.learnt, seed=seed) if config.operator == "learnt" else None
            return fit_recolour_editor(clip, raw, normalise, captions, vocabulary, config.layer, prototypes,
                                       config.group, locate_layer=config.locate_layer, recolour=operator, seed=seed)
        return fit_local_editor(clip, pixels, captions, vocabulary, config.layer, config.group,
                                transport=GaussianTransport(n_buckets=1, window=1, covariance=False),
                                seed=seed, locate_layer=config.locate_layer)
    finally:
        clip.train(was_training)


__all__ = ["build_local_editor", "recolour_prototypes"]
