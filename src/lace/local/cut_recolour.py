"""The learnt recolouring operator at a cached cut (the Flickr8k tower tops), fitted on photographs.

On the tower tops the maps entering the trainable top are cached and the tower below the cut is frozen, so the
map editor (`lace.local.maps`) edits the cached maps themselves. Its learnt operator learns from the same
self-supervision as on pixels (`lace.local.learnt`): the tower's own maps at the cut before and after a
grey-preserving colour map of the photographs, at the positions near the objects the editor's reader finds
(`colour_map_examples`). What the shapes world's palette gives there, the colour names' RGB prototypes, comes from
the CSS named colours here (`PHOTO_COLOURS`): vocabulary knowledge, not scene knowledge.

    photographs = CutPhotographs(raw, lower, photo_prototypes(names))   # raw (N, 3, H, W) in [0, 1]
    editor = fit_map_editor(maps, mentions, names, operator_fit=partial(fit_cut_operator, photographs, config))

A grey colour (black, white, gray, silver) cannot be a source: a map that keeps every grey fixed cannot repaint it
(and would repaint every grey background with it). Pairs from it are never learnt, so the operator does not move
them (zero step) and the effect check drops those edits; they can be targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lace.local.config import LearntOperatorConfig
from lace.local.learnt import LearntRecolour
from lace.local.objects import find_objects
from lace.local.reader import PositionConceptReader
from lace.local.recolour import colour_map_examples, paintable

PHOTO_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0), "orange": (255, 165, 0), "yellow": (255, 255, 0), "green": (0, 128, 0), "blue": (0, 0, 255),
    "purple": (128, 0, 128), "pink": (255, 192, 203), "brown": (165, 42, 42), "black": (0, 0, 0),
    "white": (255, 255, 255), "gray": (128, 128, 128), "grey": (128, 128, 128), "silver": (192, 192, 192),
    "gold": (255, 215, 0), "beige": (245, 245, 220), "tan": (210, 180, 140), "cyan": (0, 255, 255)}
"""RGB of colour words as the CSS named colours give them; words like "dark" or "colorful" name no one colour."""


def photo_prototypes(names: list[str]) -> Tensor:
    """(G, 3) RGB in [0, 1] of colour words `names` (`PHOTO_COLOURS`), NaN for a word that names no one colour."""
    return torch.tensor([PHOTO_COLOURS.get(name, (float("nan"),) * 3) for name in names]).float() / 255.0


@dataclass
class CutPhotographs:
    """The photographs whose maps at the cut the operator learns from, and the tower below the cut.

    raw: (N, 3, H, W) in [0, 1], as the cached maps were made from them before normalising; lower: raw pixels
    (n, 3, H, W) in [0, 1] -> (n, C, h, w) the maps at the cut (normalisation included), the cached maps' maker;
    prototypes: (G, 3) RGB in [0, 1] of the group's concepts, NaN where a concept has none (`photo_prototypes`);
    batch_size: photographs per pass of the lower tower.
    """

    raw: Tensor
    lower: Callable[[Tensor], Tensor]
    prototypes: Tensor
    batch_size: int = 64

    def features_of(self, raw: Tensor) -> Tensor:
        """(n, 3, H, W) raw pixels -> (n, h w, C) float32 region rows at the cut, without gradient."""
        with torch.no_grad():
            return torch.cat([self.lower(raw[start:start + self.batch_size]).float().flatten(2).transpose(1, 2)
                              for start in range(0, len(raw), self.batch_size)])


def fit_cut_operator(photographs: CutPhotographs, reader: PositionConceptReader,
                     config: LearntOperatorConfig | None = None, seed: int = 0) -> LearntRecolour:
    """The learnt recolouring of the group's G concepts at the cut: its objects found by the map editor's `reader`
    on the photographs' maps, its ridge and network fitted on their change under each colour map (seeded; the
    global random stream left as it was)."""
    original = photographs.features_of(photographs.raw)  # (N, P, C)
    with torch.no_grad():
        sample = photographs.lower(photographs.raw[:1])
    grid = tuple(sample.shape[-2:])
    objects = find_objects(reader, original)
    operator = LearntRecolour(config, seed=seed)
    can_source = torch.tensor([paintable(colour) for colour in photographs.prototypes], dtype=torch.bool)
    if not (objects.valid & can_source[objects.concept.cpu()].to(objects.valid.device)).any():
        raise ValueError("fit_cut_operator: expected an object of a colour a colour map can repaint (not grey, with "
                         f"an RGB prototype) among the {len(original)} photographs; none was found")
    examples = colour_map_examples(photographs.features_of, photographs.raw, original, objects, grid,
                                   photographs.prototypes, operator.window, operator.min_coverage)
    with torch.random.fork_rng(devices=[]):
        return operator.fit_examples(examples, len(photographs.prototypes))


__all__ = ["PHOTO_COLOURS", "CutPhotographs", "fit_cut_operator", "photo_prototypes"]
