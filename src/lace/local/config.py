"""`LocalEditConfig`: every knob of the edits made inside the towers, one docstring each.

Nested in `TrainConfig` as `local` (`--local-<knob>` on `lace train`, a `local:` mapping in YAML);
`lace.local.build_local_editor(config, ...)` fits the editor it describes.
"""

from __future__ import annotations

from dataclasses import dataclass

from lace.errors import input_error

LOCAL_OPERATORS = ("recolour", "mean_shift")


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
    """How local edits move positions: recolour (regression learnt from recoloured training images; needs
    colour names the shapes world's palette knows) or mean_shift (mean feature difference of two concepts)."""
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
        return self
