"""`LocalEditConfig`: every knob of the edits made inside the towers, one docstring each.

Nested in `TrainConfig` as `local` (`--local-<knob>` on `lace train`, a `local:` mapping in YAML);
`lace.local.build_local_editor(config, ...)` fits the editor it describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lace.errors import input_error

LOCAL_OPERATORS = ("recolour", "learnt", "mean_shift")
SYMMETRIC_KINDS = ("none", "round_trip", "nuisance", "no_op")
CACHED_TOPS_SERVE: dict[str, tuple[str, ...]] = {"symmetric": ("round_trip", "no_op"), "operator": ("learnt",)}
"""The settings beyond each knob's default that the edits on cached tower tops (`lace.local.maps`) serve: artefact
symmetry by round trip or no-op (not the nuisance shade, a recolouring fitted on pixels to the shapes world's
palette) and the learnt operator (fitted on photographs at the cut, `lace.local.cut_recolour`). The tops' local
source refuses the others; the tops study picks its arms with local knobs by them."""


@dataclass(frozen=True)
class LearntOperatorConfig:
    """The learnt recolouring operator (`lace.local.learnt.LearntRecolour`): a per-position network on the ridge
    regression's self-supervision, trained to reconstruct the tower's own change and to fool a real-vs-edited
    discriminator on the maps at the layer."""

    hidden: int = 64
    """Width of the operator's hidden layers (and of its discriminator's)."""
    steps: int = 300
    """Optimiser steps of the operator's fit (one mini-batch of positions each)."""
    adversarial_weight: float = 0.1
    """Weight of the adversarial term (fool the discriminator) beside the reconstruction loss (0: none)."""
    lr: float = 1e-3
    """Adam learning rate of the operator and of its discriminator."""
    rows_per_pair: int = 512
    """Positions per ordered concept pair kept for the fit (drawn once, seeded)."""
    positions_per_step: int = 512
    """Positions per optimiser step."""

    def validate(self, where: str = "local edit config") -> LearntOperatorConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        for name in ("hidden", "steps", "rows_per_pair", "positions_per_step"):
            if getattr(self, name) < 1:
                raise input_error(where, f"learnt.{name}", "a positive integer", getattr(self, name))
        if self.adversarial_weight < 0 or not self.lr > 0:
            name = "adversarial_weight" if self.adversarial_weight < 0 else "lr"
            raise input_error(where, f"learnt.{name}", "a non-negative weight and a positive lr", getattr(self, name))
        return self


@dataclass(frozen=True)
class LocalEditConfig:
    """Where and how LACE-local edits positions inside the image tower (and tokens inside the text tower)."""

    layer: str = "layer1"
    """Image-tower layer the local edits are made at (ResNet stem, layer1..layer4; ViT block<k>)."""
    locate_layer: str = "layer1"
    """Image-tower layer whose features find the objects to edit."""
    text_layer: str = "block1"
    """Text-tower layer of the caption-side swaps (block<k>: token states entering block k)."""
    n_edits: int = 2
    """Local image negatives per image: a binding swap, then transplants."""
    operator: str = "recolour"
    """How local edits move positions: recolour (ridge regression learnt from recoloured training images; needs
    colour names the shapes world's palette knows), learnt (a small network on the same self-supervision, also
    trained against a real-vs-edited discriminator; knobs in `learnt`) or mean_shift (mean feature difference of
    two concepts). On cached tower tops the map editor's Gaussian transport, or learnt (fitted on photographs at the
    cut, `lace.local.cut_recolour`)."""
    learnt: LearntOperatorConfig = field(default_factory=LearntOperatorConfig)
    """Knobs of the learnt operator (operator learnt only)."""
    edit_share: float = 1.0
    """Share of each micro-batch's rows the local image editor edits in training: the first ceil(share x B) (batches
    are drawn shuffled, so a random subset); the other rows get no local negatives and no pairs rows that step, and
    cost no editing, no extra upper-layer maps and no described captions (1: every row)."""
    fit_images: int = 2000
    """Training images the local editor's reader and operator are fitted on."""
    group: str = "colour"
    """Attribute group of the vocabulary whose concepts the local edits swap and transplant."""
    refresh_every: int = 0
    """Refit the local image editor (reader and operator) on the current tower every this many steps, after the
    optimiser step, so the edits follow the tower as it trains (0: fitted once, before the first step)."""
    fidelity_every: int = 0
    """Shapes world only: every this many steps, log the local editor's fidelity on fixed validation scenes
    (local_fidelity_* in metrics.jsonl: direction agreement of its binding swaps with the rendered swaps; 0: never)."""
    fidelity_items: int = 64
    """Validation swap_attribute items (the first ones of the world's val split) the fidelity is measured on."""
    symmetric: str = "none"
    """Where the loss compares an edit with the real image, the real image's stand-in made through the same operator
    path (`lace.local.symmetric`): none (the real image), round_trip (the edit, then its reverse at the same
    object), nuisance (the edited objects moved to a lighter shade of their own colour; recolour operator, no
    refresh; pixels only) or no_op (the operator's identity move: the real image through the same cut and upper
    pass)."""

    def validate(self, where: str = "local edit config") -> LocalEditConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        for name in ("n_edits", "fit_images", "fidelity_items"):
            if getattr(self, name) < 1:
                raise input_error(where, name, "a positive integer", getattr(self, name))
        for name in ("refresh_every", "fidelity_every"):
            if getattr(self, name) < 0:
                raise input_error(where, name, "a non-negative integer", getattr(self, name))
        if not 0 < self.edit_share <= 1:
            raise input_error(where, "edit_share", "a share in (0, 1]", self.edit_share)
        if self.operator not in LOCAL_OPERATORS:
            raise input_error(where, "operator", f"one of {LOCAL_OPERATORS}", self.operator)
        if self.symmetric not in SYMMETRIC_KINDS:
            raise input_error(where, "symmetric", f"one of {SYMMETRIC_KINDS}", self.symmetric)
        if self.symmetric == "nuisance" and (self.operator != "recolour" or self.refresh_every):
            raise input_error(where, "symmetric", "nuisance only with operator recolour and refresh_every 0 (the "
                              "shade regression is a recolouring, fitted once)", self.symmetric)
        if self.symmetric != "none" and self.edit_share < 1:
            raise input_error(where, "edit_share", "1 with symmetric counterparts (every row's real image is replaced "
                              "by its stand-in)", self.edit_share)
        self.learnt.validate(where)
        return self
