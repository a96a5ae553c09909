"""Rule-made captions (NegCLIP style): each caption rewritten by the rule editor, encoded as text, an image->text
negative (`caption_negatives`); the paired directions (`paired_directions`) move the same captions onto images.

Pixels: `rule_negatives_per_caption` per caption, drawn per sample (seed, epoch, image), encoded in the step's one
text pass. Cached features and tower tops: the one cached rule-made negative of each caption, through the heads or
the text top.
"""

from __future__ import annotations

from typing import Any

import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.edits.captions import RuleNegatives
from lace.encoders.towers.top_features import encode_captions
from lace.errors import LaceInputError
from lace.train.negatives import Negatives, rule_made_captions
from lace.train.paths.base import EmbedPath, MicroBatch, Run
from lace.train.sources.base import NegativeSource


class RuleCaptions(NegativeSource):
    name = "rule captions"
    switch = "caption_negatives"

    @classmethod
    def switched_on(cls, config) -> bool:
        return config.arm.uses_rule_captions or super().switched_on(config)

    @classmethod
    def check(cls, run: Run, path: EmbedPath, given: dict[str, Any]) -> None:
        cached = {"features": "negative_features", "tops": "negative_states"}.get(path.name)
        if cached is not None and getattr(run.pairs, cached) is None:
            what = "token states" if path.name == "tops" else "features"
            raise LaceInputError(f"{path.where}: fields 'caption_negatives' / 'paired_caption_directions': expected "
                                 f"the cached {what} of the rule-made captions in the {type(run.pairs).__name__}")

    def __init__(self, run: Run, path: EmbedPath, given: dict[str, Any]):
        super().__init__(run, path, given)
        self.rules = None
        if path.name == "pixels":
            self.rules = RuleNegatives(load_vocabulary(self.config.run.vocabulary), self.config.negatives.rule_negative_kinds)
        self.texts: list[str] = []
        self.valid: torch.Tensor | None = None

    def pass_texts(self, micro: MicroBatch) -> list[str] | None:
        if self.rules is None:
            return None
        keys = [(self.config.run.seed, micro.epoch, index) for index in micro.batch.indices]
        self.texts, self.valid = rule_made_captions(self.rules, micro.batch.captions, keys,
                                                    self.config.negatives.rule_negatives_per_caption)
        return self.texts

    def embed(self, micro: MicroBatch) -> None:
        getattr(self, f"_embed_{self.path.name}")(micro)

    def _embed_pixels(self, micro: MicroBatch) -> None:
        n, per_caption = len(micro.batch.captions), self.config.negatives.rule_negatives_per_caption
        rule_texts = micro.pass_texts[self.name].view(n, per_caption, -1)  # (B, R, d)
        micro.rule_captions = (rule_texts, self.valid.to(self.run.device))
        micro.rule_strings = [self.texts[b * per_caption:(b + 1) * per_caption] for b in range(n)]

    def _embed_features(self, micro: MicroBatch) -> None:
        batch, device = micro.batch, self.run.device
        rule_texts = self.run.encoder.head_text(batch.negative_features.to(device))  # (B, d)
        micro.rule_captions = (rule_texts.unsqueeze(1), batch.negative_valid.to(device).unsqueeze(1))

    def _embed_tops(self, micro: MicroBatch) -> None:
        pairs, top = self.run.pairs, self.run.encoder
        rows = pairs.negative_of_caption[micro.batch.caption_rows]
        valid = torch.from_numpy(rows >= 0).to(self.run.device)
        rule_texts = micro.V.new_zeros(len(rows), top.embed_dim)
        if valid.any():
            rule_texts = rule_texts.index_put((valid,), encode_captions(top, pairs.negative_states, rows[rows >= 0]))
        micro.rule_captions = (rule_texts[:, None], valid[:, None])
        if micro.describe is not None:  # the paired directions' captions and the rule collisions read them
            micro.rule_strings = [[pairs.negative_texts[row] if row >= 0 else caption]  # as rule_made_captions
                                  for row, caption in zip(rows, micro.captions)]

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        if self.config.arm.caption_negatives:
            negatives.add_captions(*micro.rule_captions)
