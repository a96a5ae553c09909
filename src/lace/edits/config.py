"""`EditConfig`: every knob of the counterfactual editor, one docstring each.

Nested in the train, demo, eval and study configs (`--edit-<knob>` on every command, an
`edit:` mapping in YAML); `lace.edits.build_editor(labelled, config)` turns it into an editor.
"""

from __future__ import annotations

from dataclasses import dataclass

from lace.concepts.thresholds import DEFAULT_TAU_USE
from lace.errors import input_error

EDIT_KINDS = ("attenuate", "swap", "transplant", "rebind")
TARGET_MODES = ("random", "hard")
# rebind (needs binding directions in the dictionary folder) is opt-in, so runs made before it keep their edits
METHOD_EDIT_KINDS = ("attenuate", "swap", "transplant")


@dataclass(frozen=True)
class EditConfig:
    """How counterfactual edits of sparse concept codes are chosen and checked."""

    kinds: tuple[str, ...] = METHOD_EDIT_KINDS
    """Edit kinds to draw from: attenuate, swap, transplant, and the opt-in rebind (which needs a dictionary with
    bindings)."""
    n_edits: int = 4
    """M: counterfactual edits per embedding and side."""
    gamma: float = 0.0
    """Attenuate factor in [0, 1): the atoms of the attenuated concept are scaled by it."""
    strength: float = 1.0
    """Transplant strength (> 0): the target receives strength x the source's weight; also sizes rebinds."""
    target: str = "random"
    """Transplant and swap target: random, hard (the closest concept direction) or a named pair source=target."""
    tau_align: float | None = None
    """Alignment threshold for the atoms a concept owns (None: the labelling's calibrated one)."""
    tau_use: float = DEFAULT_TAU_USE
    """A concept is editable when its weight is at least tau_use x the embedding's largest concept weight."""
    effect_check: bool = True
    """Keep only edits whose concept readouts move as the edit says (METHOD.md section 4)."""
    atom_level: bool = False
    """Edit single aligned atoms instead of whole concepts (the naive variant; rebind proposes nothing)."""
    swap_min_gap: float = 0.1
    """A swap is skipped when the two weights differ by at most this share of the larger one."""
    attenuate_margin: float = 0.02
    """The readout drop (cosine) an attenuation must achieve to pass the effect check."""

    def validate(self, where: str = "edit config") -> EditConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        if not self.kinds or any(kind not in EDIT_KINDS for kind in self.kinds):
            raise input_error(where, "kinds", f"a non-empty subset of {EDIT_KINDS}", self.kinds)
        if self.n_edits < 1:
            raise input_error(where, "n_edits", "a positive integer", self.n_edits)
        if not 0.0 <= self.gamma < 1.0:
            raise input_error(where, "gamma", "a value in [0, 1)", self.gamma)
        if self.strength <= 0:
            raise input_error(where, "strength", "a positive transplant strength", self.strength)
        if not 0.0 <= self.tau_use <= 1.0:
            raise input_error(where, "tau_use", "a value in [0, 1]", self.tau_use)
        if self.swap_min_gap < 0 or self.attenuate_margin < 0:
            raise input_error(where, "swap_min_gap / attenuate_margin", "non-negative values",
                              (self.swap_min_gap, self.attenuate_margin))
        if self.target not in TARGET_MODES and "=" not in self.target:
            raise input_error(where, "target", "'random', 'hard' or a named pair 'source=target'", self.target)
        return self
