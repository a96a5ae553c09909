"""Binding swaps and transplants on cached feature maps, where the tower below the cut never runs.

The image-side local arm of the Flickr8k tower tops: the maps entering EfficientNet-Lite0's last
stage are cached (`lace.encoders.towers.top_features`), so objects are found and edited on those
maps themselves and the trainable top runs on the edited ones.

    editor = fit_map_editor(train_maps, mentions, names)      # maps (N, C, H, W); mentions (N, G) bool
    edits = editor.edit(maps, n_edits=2)                      # edits.maps (B, M, C, H, W), edits.valid (B, M)

Slot 0 is the binding swap (the two found objects exchange their concepts); slots 1 .. M-1
transplant a concept no object has onto one object's positions. Every edit is kept only when the
position reader reads it as done (the effect check). Captions name the concepts an image shows,
never where: the reader is fitted to caption mentions alone (`lace.local.reader`).

The operator is the Gaussian transport between the concepts' position features, or, given an
`operator_fit` (`lace.local.cut_recolour.fit_cut_operator`), the learnt recolouring fitted on the tower's
own maps before and after a colour map of photographs. `edit(..., symmetric=KIND)` also makes each slot's
artefact-symmetric counterpart of the real map (`lace.local.symmetric`) with the same operator, objects and
slot moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lace.local.editor import LocalImageEditor
from lace.local.edits import random_control
from lace.local.objects import FoundObjects, find_objects
from lace.local.reader import PositionConceptReader
from lace.local.state import editor_from_state, editor_state
from lace.local.symmetric import counterpart_steps
from lace.local.transport import GaussianTransport
from lace.row_random import Randomness

CUT_LAYER = "cut"
"""The editor's name for the layer it edits: the cached maps' own."""


def regions_of(maps: Tensor) -> Tensor:
    """(B, C, H, W) maps -> (B, H * W, C) position rows, float32."""
    return maps.float().flatten(2).transpose(1, 2)


def maps_of(regions: Tensor, grid: tuple[int, int]) -> Tensor:
    """(..., H * W, C) position rows -> (..., C, H, W) maps."""
    return regions.transpose(-1, -2).reshape(*regions.shape[:-2], regions.shape[-1], *grid)


@dataclass
class MapEdits:
    """maps (B, M, C, H, W) edited maps; valid (B, M) bool; kinds: each slot's edit; objects: those found;
    changes (B, M, 2) long, the concepts each slot changed (`lace.local.editor.EditSlots`); counterparts
    (B, M, C, H, W): per slot, the real map's artefact-symmetric stand-in (None unless asked for)."""

    maps: Tensor
    valid: Tensor
    kinds: list[str]
    objects: FoundObjects
    changes: Tensor
    counterparts: Tensor | None = None


class MapEditor:
    """Local edits of one attribute group on (B, C, H, W) maps of a fixed grid.

    editor: the fitted `LocalImageEditor` whose reader and transport act at the maps' layer;
    grid: (H, W) of the maps.
    """

    def __init__(self, editor: LocalImageEditor, grid: tuple[int, int]):
        self.editor = editor
        self.grid = tuple(grid)

    @property
    def concept_names(self) -> list[str]:
        return self.editor.concept_names

    def reseed(self, seed: int) -> None:
        """Restart the draws of transplant targets and random controls from `seed`."""
        self.editor.generator.manual_seed(seed)

    @property
    def operator(self):
        """What moves the positions: the Gaussian transport, or the learnt recolouring (`fit_map_editor`)."""
        return self.editor.transport

    def state_dict(self) -> dict:
        """The fitted editor as plain tensors and numbers (`lace.local.state.editor_state`) and its grid."""
        return {"grid": list(self.grid), "editor": editor_state(self.editor)}

    @classmethod
    def from_state(cls, state: dict) -> MapEditor:
        """The editor `state_dict()` saved, making the same edits."""
        return cls(editor_from_state(state["editor"]), tuple(int(side) for side in state["grid"]))

    @torch.no_grad()
    def edit(self, maps: Tensor, n_edits: int, control: bool = False, generator: Randomness = None,
             symmetric: str = "none") -> MapEdits:
        """Edited copies of `maps` (B, C, H, W): `n_edits` slots each, no gradient (the maps are inputs).

        control: replace every step by a random step of the same size at the same positions.
        generator: the draws of transplant targets (None: the editor's own; `RowGenerators`: one per row).
        symmetric: a kind of `lace.local.symmetric` other than none (round_trip, no_op; nuisance needs a shade
        regression the maps cannot give): also each slot's counterpart of the real map, moved from the same maps
        by the same operator at the same objects (`counterpart_steps`).
        """
        if n_edits < 1:
            raise ValueError(f"n_edits: expected >= 1, got {n_edits}")
        if tuple(maps.shape[-2:]) != self.grid:
            raise ValueError(f"maps: expected a {self.grid} grid, got {tuple(maps.shape[-2:])}")
        regions = regions_of(maps)  # (B, P, C)
        objects = find_objects(self.editor.reader, regions)
        slots = self.editor.steps(regions, self.grid, n_edits, objects, generator)
        steps = slots.steps  # (B, M, P, C)
        if control:
            steps = random_control(steps, self.editor.generator)
        edited = maps_of(regions[:, None] + steps, self.grid)
        counterparts = None
        if symmetric != "none":
            partners = counterpart_steps(symmetric, self.editor.transport, regions, self.grid, objects, slots)
            counterparts = maps_of(regions[:, None] + partners, self.grid)
        return MapEdits(edited, slots.valid, slots.kinds, objects, slots.changes, counterparts)


def fit_map_editor(maps: Tensor, mentions: Tensor, concept_names: list[str], seed: int = 0,
                   transport: GaussianTransport | None = None, batch_size: int = 1000,
                   operator_fit: Callable[[PositionConceptReader], object] | None = None) -> MapEditor:
    """Fit the position reader and the operator of one attribute group on training maps.

    maps (N, C, H, W) (float16 is read in batches of `batch_size`); mentions (N, G) bool, which of the
    group's G concepts `concept_names` each image's captions name. The operator is the `transport`, by default
    Gaussian maps between concepts per coverage bucket, one position at a time; or, given `operator_fit`, what it
    fits from the fitted reader (`lace.local.cut_recolour.fit_cut_operator`: the learnt recolouring).
    """
    if maps.ndim != 4 or mentions.shape != (maps.shape[0], len(concept_names)):
        raise ValueError(f"expected maps (N, C, H, W) and mentions (N, {len(concept_names)}), got "
                         f"{tuple(maps.shape)} and {tuple(mentions.shape)}")
    grid = tuple(maps.shape[-2:])
    regions = torch.cat([regions_of(maps[i:i + batch_size]) for i in range(0, len(maps), batch_size)])
    reader = PositionConceptReader(random_state=seed).fit(regions, mentions)
    if operator_fit is not None:
        return MapEditor(LocalImageEditor(CUT_LAYER, reader, operator_fit(reader), concept_names, seed=seed), grid)
    objects = find_objects(reader, regions)
    coverage = objects.coverage * objects.valid[..., None]
    transport = (transport or GaussianTransport(n_buckets=3, window=1)).fit(regions, grid, objects.concept, coverage,
                                                                           len(concept_names))
    return MapEditor(LocalImageEditor(CUT_LAYER, reader, transport, concept_names, seed=seed), grid)


__all__ = ["MapEditor", "MapEdits", "fit_map_editor", "maps_of", "regions_of"]
