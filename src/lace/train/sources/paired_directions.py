"""Paired-caption directions (AHNPL style): each rule-made caption t' of caption t moved onto the image,
normalise(u + v(t') - v(t)), a text->image negative (`lace.train.negatives.paired_caption_directions`)."""

from __future__ import annotations

from lace.train.negatives import Negatives, paired_caption_directions
from lace.train.paths.base import MicroBatch
from lace.train.sources.base import NegativeSource


class PairedDirections(NegativeSource):
    name = "paired directions"
    switch = "paired_caption_directions"
    paths = ("pixels", "tops")  # pooled features have no token states to write an edit's caption into
    needs = ("rule captions",)

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        rule_texts, rule_valid = micro.rule_captions
        captions = None
        if micro.describe is not None:  # the edit's caption is the rule-made caption itself
            captions = lambda: [list(row) for row in micro.rule_strings]
        negatives.add_image_edits(paired_caption_directions(micro.U, micro.V, rule_texts), rule_valid,
                                  self.config.arm.edited_image_columns, captions)
