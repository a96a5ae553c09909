"""`NegativesConfig`: how the arm's negatives are made and weighed, with the editors' own configs nested."""

from __future__ import annotations

from dataclasses import dataclass, field

from lace.edits.captions import KINDS as RULE_KINDS
from lace.edits.config import EditConfig
from lace.errors import input_error
from lace.local.config import LocalEditConfig


@dataclass
class NegativesConfig:
    """The knobs of the negatives whichever arm switches them on: their weights in the loss, the rule-made
    captions, the dictionary refresh, the counterfactual editor and the local editor."""

    counterfactual_weight: float = 1.0
    """w in plain + w * (extended - plain); 1 is one softmax over batch and negatives (with the sigmoid
    loss: the weight of the negatives' own z = -1 terms)."""
    mask_duplicate_pairs: bool = False
    """Leave other copies of a pair's image or caption in the batch (all processes) out of its softmax
    in both directions. Off by default: every other pair is a negative, as in open_clip's ClipLoss."""
    edited_rows_weight: float = 1.0
    """Weight of the edited rows' term (`lace.losses.pair_loss`) added to the loss; it scales only those terms."""
    rule_negative_kinds: tuple[str, ...] = RULE_KINDS
    """Rule-made caption negative kinds: swap_attributes, swap_objects, replace_attribute, replace_object, replace_relation."""
    rule_negatives_per_caption: int = 1
    """Rule-made negatives drawn per caption (each encoded by the text tower)."""
    refresh_dictionary_every: int = 0
    """Refit the dictionary on recent embeddings every this many steps (0: never)."""
    refresh_pool_size: int = 4096
    """Recent embeddings per modality kept for a dictionary refit."""
    edit: EditConfig = field(default_factory=EditConfig)
    """The counterfactual editor's knobs, M = `n_edits` among them (`--edit-<knob>`; `edit:` in YAML)."""
    local: LocalEditConfig = field(default_factory=LocalEditConfig)
    """LACE-local's knobs: where and how the image and caption towers are edited (`--local-<knob>`; `local:` in
    YAML)."""

    def validate(self, where: str = "train config") -> NegativesConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        if self.rule_negatives_per_caption < 1:
            raise input_error(where, "rule_negatives_per_caption", "a positive integer", self.rule_negatives_per_caption)
        if not self.rule_negative_kinds or any(kind not in RULE_KINDS for kind in self.rule_negative_kinds):
            raise input_error(where, "rule_negative_kinds", f"a non-empty subset of {RULE_KINDS}",
                              self.rule_negative_kinds)
        if self.refresh_dictionary_every < 0:
            raise input_error(where, "refresh_dictionary_every", "a non-negative integer",
                              self.refresh_dictionary_every)
        for name in ("counterfactual_weight", "edited_rows_weight"):
            if getattr(self, name) < 0:
                raise input_error(where, name, "a non-negative weight", getattr(self, name))
        self.edit.validate(f"{where}: edit")
        self.local.validate(f"{where}: local")
        return self
