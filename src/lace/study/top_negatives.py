"""The training arms of the tower tops: each arm's extra negatives for one batch of cached intermediates.

An arm is an entry of `lace.experiment.variants`, read onto `TopArm`, so the tops train the
arms of the shapes world under the same names and switches:

- caption negatives: one rule-made negative per caption (cached token states), image->text;
- LACE / concept-arithmetic negatives: dictionary edits of the pooled embeddings, both ways;
- paired-caption directions: `normalise(u + v(t') - v(t))`, text->image;
- LACE-local: binding swaps and transplants of the maps entering the image top
  (`lace.local.maps`), run through the trainable top, text->image.

    arm = top_arm("LACE-local")
    negatives = batch_negatives(top, arm, sources, maps, U, V, caption_rows, generator)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from lace.edits.config import EditConfig
from lace.encoders.towers.top import TowersTop
from lace.encoders.towers.top_features import TokenStates, encode_captions
from lace.errors import input_error
from lace.experiment.variants import VARIANTS, variant_config
from lace.local.maps import MapEditor
from lace.train.config import ArmSwitches
from lace.train.negatives import Negatives, counterfactual_negatives, paired_caption_directions


@dataclass(frozen=True)
class TopArm(ArmSwitches):
    """The switches of `lace.train.config.TrainConfig` that an arm of the tower tops reads."""

    caption_negatives: bool = False
    counterfactual_captions: bool = False
    counterfactual_images: bool = False
    counterfactual_source: str = "dictionary"
    paired_caption_directions: bool = False
    local_image_negatives: bool = False
    local_caption_swaps: bool = False
    rendered_negatives: bool = False
    edit: EditConfig = field(default_factory=EditConfig)


def top_arm(name: str) -> TopArm:
    """The switches of variant `name`; refuse the arms that need pixels or token ids below the cut."""
    arm = variant_config(TopArm(), name)
    if arm.local_caption_swaps or arm.rendered_negatives:
        raise input_error("tower-top arms", "variant", "an arm that needs no pixels or token ids below the cut "
                          f"(one of {[n for n in VARIANTS if not _below_cut(n)]})", name)
    return arm


def _below_cut(name: str) -> bool:
    return bool(VARIANTS[name].get("local_caption_swaps") or VARIANTS[name].get("rendered_negatives"))


@dataclass
class RuleStates:
    """Cached token states of one rule-made negative per caption.

    states: token states of the negatives; row_of_caption (N_txt,) int64: the negative of dataset
    caption i is states row `row_of_caption[i]`, -1 where no rule applies (or the caption is not trained on).
    """

    states: TokenStates
    row_of_caption: np.ndarray


@dataclass
class TopNegativeSources:
    """What the arms draw negatives from; an arm needs only its own source.

    rules: rule-made caption negatives; editor: the pooled dictionary's `CounterfactualEditor`;
    map_editor: the local editor of the maps; n_edits: M of the pooled edits; local_n_edits: M of the local ones.
    """

    rules: RuleStates | None = None
    editor: object | None = None
    map_editor: MapEditor | None = None
    n_edits: int = 4
    local_n_edits: int = 2

    def check(self, arm: TopArm, name: str) -> None:
        """Refuse an arm whose source is missing, before any step."""
        missing = [what for what, needed, present in (
            ("rule-made caption negatives", arm.uses_rule_captions, self.rules),
            ("a concept dictionary editor", arm.uses_counterfactuals, self.editor),
            ("a local map editor", arm.local_image_negatives, self.map_editor)) if needed and present is None]
        if missing:
            raise input_error("tower-top arms", name, f"{' and '.join(missing)} for this arm", "none given")


def rule_negatives(top: TowersTop, rules: RuleStates, caption_rows: np.ndarray) -> tuple[Tensor, Tensor]:
    """(B, 1, d) unit embeddings of the captions' rule-made negatives (zeros where none) and (B, 1) valid."""
    rows = rules.row_of_caption[np.asarray(caption_rows)]
    valid = torch.from_numpy(rows >= 0).to(top.encoder.device)
    embeddings = torch.zeros(len(rows), top.encoder.embed_dim, device=top.encoder.device)
    if valid.any():
        embeddings = embeddings.index_put((valid,), encode_captions(top, rules.states, rows[rows >= 0]))
    return embeddings[:, None], valid[:, None]


def local_image_negatives(top: TowersTop, editor: MapEditor, maps: Tensor, n_edits: int) -> tuple[Tensor, Tensor]:
    """(B, M, d) unit embeddings of the maps' local edits through the trainable top (zeros where the
    edit is not valid, which the loss masks) and (B, M) valid."""
    edits = editor.edit(maps, n_edits)
    valid = edits.valid.to(top.encoder.device)
    embeddings = torch.zeros(*valid.shape, top.encoder.embed_dim, device=top.encoder.device)
    if valid.any():
        embeddings = embeddings.index_put((valid,), top.encode_image_states(edits.maps[edits.valid]))
    return embeddings, valid


def batch_negatives(top: TowersTop, arm: TopArm, sources: TopNegativeSources, maps: Tensor, U: Tensor, V: Tensor,
                    caption_rows: np.ndarray, generator: torch.Generator | None = None) -> Negatives:
    """The arm's negatives for a batch: maps (B, C, H, W) cached image inputs, U, V (B, d) their unit
    embeddings with gradient, caption_rows (B,) dataset rows of the paired captions."""
    negatives = Negatives()
    if arm.uses_rule_captions:
        rule_texts, rule_valid = rule_negatives(top, sources.rules, caption_rows)
        if arm.caption_negatives:
            negatives.add_captions(rule_texts, rule_valid)
        if arm.paired_caption_directions:
            negatives.add_images(paired_caption_directions(U, V, rule_texts), rule_valid)
    if arm.uses_counterfactuals:
        edited = counterfactual_negatives(sources.editor, U, V, sources.n_edits, arm.counterfactual_captions,
                                          arm.counterfactual_images, arm.counterfactual_source, generator)
        if edited.caption_negatives is not None:
            negatives.add_captions(edited.caption_negatives, edited.caption_valid)
        if edited.image_negatives is not None:
            negatives.add_images(edited.image_negatives, edited.image_valid)
    if arm.local_image_negatives:
        negatives.add_images(*local_image_negatives(top, sources.map_editor, maps, sources.local_n_edits))
    return negatives


__all__ = ["RuleStates", "TopArm", "TopNegativeSources", "batch_negatives", "local_image_negatives",
           "rule_negatives", "top_arm"]
