"""Artefact-symmetric counterparts of LACE-local's edits: what replaces the real image wherever the loss compares it
with an edit, made through the same operator path as the edit, so that "edited" carries no information there.

For each slot of `LocalImageEditor.steps` (slot 0 the binding swap of objects 0 and 1, slot m >= 1 a transplant on
object (m - 1) mod n), the counterpart moves the same object(s) of the same image at the same layer, with the same
operator, and runs through the same upper pass as the edit:
- `round_trip`: the edit, then its reverse at the same object(s) on the edited features (a -> b -> a);
- `nuisance`: the object(s) the slot edits moved to a lighter shade of their own colour, a property no caption
  names (the shapes world's objects vary in shade), by a recolouring regression fitted like the editor's own
  (`fit_shade_regression`, recolour operator only);
- `no_op`: the editor's operator asked to move each object from its colour to its colour (the identity colour
  map). The ridge recolouring learns no identity pair and a mean shift from a concept to itself is zero, so the
  step is zero: the counterpart is the real image through the same cut and upper pass.

    made = symmetric_negatives(editor, clip, pixels, n_edits=2, kind="round_trip")
    made.negatives          # `LocalNegatives` as `editor.negatives` gives them (the same pass)
    made.counterparts       # (B, M, d) unit: slot m's counterpart of the real image
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lace.concepts.vocabulary import Vocabulary
from lace.local.build import recolour_prototypes
from lace.local.config import SYMMETRIC_KINDS, LocalEditConfig
from lace.local.editor import EditSlots, LocalImageEditor, LocalNegatives
from lace.local.objects import FoundObjects
from lace.local.reader import PositionConceptReader
from lace.local.recolour import RecolourRegression, recolour_examples
from lace.local.towers import ImageTowerSplit
from lace.row_random import Randomness

SHADE_LIGHTEN = 0.25
"""A nuisance shade: each colour moved this fraction of the way to white (hue kept, the colour word unchanged)."""


@dataclass
class SymmetricNegatives:
    """negatives: the edits (`LocalNegatives`); counterparts (B, M, d) unit: per slot, the image that stands for
    the real one wherever the loss compares it with that slot's edit."""

    negatives: LocalNegatives
    counterparts: Tensor


def slot_moves(slots: EditSlots, objects: FoundObjects) -> list[list[tuple[Tensor, Tensor, Tensor]]]:
    """Per slot, the moves its edit made: (object index (B,), concept before (B,), concept after (B,)) each.

    Slot 0's binding swap moves object 0 from its concept to object 1's and object 1 back; a transplant in slot m
    moves object (m - 1) mod n (`LocalImageEditor.steps`) from the concept it had to the one the slot names."""
    batch, n_objects = objects.concept.shape
    device = objects.concept.device
    moves = []
    for slot, kind in enumerate(slots.kinds):
        before, after = slots.changes[:, slot, 0].to(device), slots.changes[:, slot, 1].to(device)
        if kind == "swap":
            first, second = (torch.full((batch,), k, dtype=torch.long, device=device) for k in (0, 1))
            moves.append([(first, before, after), (second, after, before)])
        else:
            which = torch.full((batch,), (slot - 1) % n_objects, dtype=torch.long, device=device)
            moves.append([(which, before, after)])
    return moves


def counterpart_steps(kind: str, operator, features: Tensor, grid: tuple[int, int], objects: FoundObjects,
                      slots: EditSlots, shade: RecolourRegression | None = None) -> Tensor:
    """(B, M, P, C) steps of the slots' counterparts of `kind` on region features (B, P, C); zero where a slot has
    no valid edit. operator: the editor's (`move(features, grid, coverage, source, target)`); shade: the nuisance
    regression (`fit_shade_regression`), needed for `nuisance`."""
    if kind not in SYMMETRIC_KINDS[1:]:
        raise ValueError(f"kind: expected one of {SYMMETRIC_KINDS[1:]}, got {kind!r}")
    if kind == "nuisance" and shade is None:
        raise ValueError("shade: expected the fitted shade regression (fit_shade_regression) for kind 'nuisance'")
    features = features.detach().contiguous()  # the steps carry no gradient; one layout makes every move cheaper
    rows = torch.arange(features.shape[0], device=features.device)
    steps = []
    for slot, moves in enumerate(slot_moves(slots, objects)):
        edit_step = slots.steps[:, slot]  # (B, P, C)
        step = edit_step if kind == "round_trip" else torch.zeros_like(edit_step)
        edited = features + edit_step if kind == "round_trip" else None  # the slot's edited features, once
        for which, before, after in moves:
            coverage = objects.coverage[rows, which]  # (B, P)
            if kind == "round_trip":  # back from the edited features, at the same object
                step = step + operator.move(edited, grid, coverage, after, before)
            elif kind == "no_op":
                step = step + operator.move(features, grid, coverage, before, before)
            else:
                step = step + shade.move(features, grid, coverage, before, before + shade.n_concepts_ // 2)
        steps.append(step * slots.valid[:, slot, None, None].to(step.dtype))
    return torch.stack(steps, dim=1)


def symmetric_negatives(editor: LocalImageEditor, clip: torch.nn.Module, pixels: Tensor, n_edits: int, kind: str,
                        shade: RecolourRegression | None = None, generator: Randomness = None) -> SymmetricNegatives:
    """`editor.negatives(clip, pixels, n_edits, generator=generator)` with each slot's counterpart of `kind`: the
    lower tower runs once, the upper layers once on the B real, B x M edited and B x M counterpart maps together
    (BatchNorm statistics from the B real maps alone, as for the edits), so edit and counterpart share the cut, the
    operator and the upper pass. pixels (B, 3, H, W) model input."""
    if n_edits < 1:
        raise ValueError(f"n_edits: expected >= 1, got {n_edits}")
    split = ImageTowerSplit(clip, editor.layer)
    features = split.lower(pixels)  # (B, n_prefix + P, C), with gradient
    regions = split.regions(features).detach().contiguous()  # what the editor reads: one copy for all of it
    objects = editor.locate(clip, pixels, regions, split.grid)
    slots = editor.steps(regions, split.grid, n_edits, objects, generator)
    partners = counterpart_steps(kind, editor.transport, regions, split.grid, objects, slots, shade)
    steps = torch.cat([slots.steps, partners], dim=1)  # (B, 2M, P, C): the edits, then their counterparts
    if split.n_prefix:
        steps = torch.cat([steps.new_zeros(*steps.shape[:2], split.n_prefix, steps.shape[-1]), steps], dim=2)
    batch, maps_per_image = features.shape[0], steps.shape[1]
    moved = features.unsqueeze(1) + steps.to(features.dtype)  # (B, 2M, P_all, C)
    maps = torch.cat([features, moved.transpose(0, 1).reshape(batch * maps_per_image, *features.shape[1:])])
    embeddings = split.upper(maps, reference_rows=batch)  # (B (1 + 2M), d): the originals, then slot by slot
    per_slot = embeddings[batch:].reshape(maps_per_image, batch, -1).transpose(0, 1)  # (B, 2M, d)
    negatives = LocalNegatives(per_slot[:, :n_edits], slots.valid, slots.kinds, objects, original=embeddings[:batch],
                               changes=slots.changes)
    return SymmetricNegatives(negatives, per_slot[:, n_edits:])


def build_shade_regression(config: LocalEditConfig, editor: LocalImageEditor, clip: torch.nn.Module, pixels: Tensor,
                           normalise, vocabulary: Vocabulary) -> RecolourRegression | None:
    """The nuisance regression `config.symmetric` needs (None unless it is `nuisance`), fitted with the editor's
    reader on the (N, 3, H, W) model-input pixels the editor was fitted on; clip left in the mode it had."""
    if config.symmetric != "nuisance":
        return None
    prototypes = recolour_prototypes(vocabulary, config.group)
    std, mean = (torch.tensor(values, device=pixels.device).view(1, 3, 1, 1) for values in (normalise.std, normalise.mean))
    was_training = clip.training
    clip.eval()
    try:
        return fit_shade_regression(clip, editor.layer, pixels * std + mean, normalise, editor.reader,
                                    prototypes.to(pixels.device), editor.locate_layer)
    finally:
        clip.train(was_training)


def real_stand_ins(original: Tensor, counterparts: Tensor, valid: Tensor) -> Tensor:
    """(B, d) the image each row's real caption is compared with: the counterpart of its first valid slot
    (counterparts (B, M, d), valid (B, M)), the real image `original` (B, d) where no slot is valid."""
    valid = valid.to(torch.bool).to(counterparts.device)
    first = valid.float().argmax(dim=1)  # (B,) 0 where none is valid (masked below)
    picked = counterparts[torch.arange(len(first), device=first.device), first]
    return torch.where(valid.any(dim=1, keepdim=True), picked, original)


def shade_prototypes(prototypes: Tensor, lighten: float = SHADE_LIGHTEN) -> Tensor:
    """(G, 3) RGB in [0, 1] -> (G, 3) each colour `lighten` of the way to white."""
    return prototypes + lighten * (1 - prototypes)


def fit_shade_regression(clip: torch.nn.Module, layer: str, raw_pixels: Tensor, normalise,
                         reader: PositionConceptReader, prototypes: Tensor, locate_layer: str | None = None,
                         lighten: float = SHADE_LIGHTEN, batch_size: int = 500) -> RecolourRegression:
    """A `RecolourRegression` of G extra concepts, the lighter shades of the group's: pair (a, G + a) moves a's
    positions to a's lighter shade, learnt as the editor's recolouring is (a grey-preserving colour map of the
    training images, features before and after at `layer`, ridge on each position's neighbourhood) for these G
    pairs only. raw_pixels (N, 3, H, W) in [0, 1]; prototypes (G, 3) RGB in [0, 1]."""
    regression = RecolourRegression()
    examples = recolour_examples(clip, layer, raw_pixels, normalise, reader, prototypes, locate_layer,
                                 regression.window, regression.min_coverage, batch_size,
                                 own_targets=shade_prototypes(prototypes, lighten))
    return regression.fit_examples(examples, 2 * len(prototypes))


__all__ = ["SHADE_LIGHTEN", "SYMMETRIC_KINDS", "SymmetricNegatives", "build_shade_regression", "counterpart_steps", "fit_shade_regression",
           "real_stand_ins", "shade_prototypes", "slot_moves", "symmetric_negatives"]
