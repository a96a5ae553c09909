"""The pairs layout (TripletCLIP's, `lace.train.pairs`): every image-side edit the other sources made also a row of
its own, positive with the caption its edit describes (`edited_image_rows`); and, for any arm with image edits
whose captions can be written, the provenance figures of those edits on logged steps.

It runs after every other source (`order`), reading their `Negatives.edited`; it sets `MicroBatch.describe` before
the model runs so that they keep their edits with the captions those describe.
"""

from __future__ import annotations

from typing import Any

import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.edits.captions import RuleNegatives
from lace.errors import LaceInputError
from lace.train.negatives import Negatives, rule_collisions, valid_rows
from lace.train.pairs import describe_slots, pair_rows, pair_term, provenance_sums
from lace.train.paths.base import EmbedPath, MicroBatch, Run
from lace.train.sources.base import NegativeSource


class PairsRows(NegativeSource):
    name = "pairs rows"
    switch = "edited_image_rows"
    paths = ("pixels", "tops")  # pooled features have no token states to write an edit's caption into
    order = 1

    @classmethod
    def wanted(cls, config, path: EmbedPath) -> bool:
        describes = config.arm.uses_image_edits and config.run.vocabulary is not None and path.describable()
        return cls.switched_on(config) or describes

    @classmethod
    def check(cls, run: Run, path: EmbedPath, given: dict[str, Any]) -> None:
        missing = path.missing_for_descriptions() if path.name == "tops" else []
        if run.config.arm.edited_image_rows and missing:
            raise LaceInputError(f"{path.where}: field 'edited_image_rows': expected the TopPairs' "
                                 f"{' and '.join(missing)} (each edit's caption is written from the caption texts, "
                                 "and its token states made through the text tower below the cut)")

    def __init__(self, run: Run, path: EmbedPath, given: dict[str, Any]):
        super().__init__(run, path, given)
        self.describer = RuleNegatives(load_vocabulary(self.config.run.vocabulary))  # writes each edit's caption

    def begin(self, micro: MicroBatch) -> None:
        if self.config.arm.edited_image_rows or micro.logged:
            micro.describe = lambda changes: describe_slots(self.describer, micro.captions, changes)

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        if negatives.edited and self.config.arm.caption_negatives and micro.rule_strings is not None:
            negatives.rule_collisions = rule_collisions(negatives.edited, micro.rule_strings)

    def loss_term(self, micro: MicroBatch, negatives: Negatives) -> tuple[torch.Tensor | None, dict[str, Any]]:
        config, U, V = self.config, micro.U, micro.V
        if not negatives.edited:
            return None, {}
        term, figures = None, {}
        if config.arm.edited_image_rows:
            text = config.arm.edited_rows_train_text
            rows = pair_rows(negatives.edited, self.encode_texts if text else self.encode_constants)
            bias = self.run.logit_bias if config.run.loss == "sigmoid" else None
            term = config.negatives.edited_rows_weight * pair_term(rows, U, V if text else V.detach(), micro.scale, bias,
                                                         self.run.context, config.arm.edited_rows_real_image_negative)
            figures["pair_valid"] = valid_rows(rows.valid)
        else:  # a columns-only arm at a logged step: its edits' captions, for the provenance figures alone
            with torch.no_grad():
                rows = pair_rows(negatives.edited, self.encode_texts)
        if micro.logged:
            figures["provenance"] = provenance_sums(U, V, rows)
        return term, figures

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """(n,) described captions -> (n, d) unit embeddings through the path's text side (with gradient when it is
        on). Read without gradient, for the provenance figures alone, they leave the run's random stream (the text
        tower's dropout) as it was: a columns-only arm trains as it would without them."""
        if torch.is_grad_enabled():
            return self.path.encode_texts(texts)
        devices = [self.run.device] if self.run.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            return self.path.encode_texts(texts)

    def encode_constants(self, texts: list[str]) -> torch.Tensor:
        """`encode_texts` without gradient: (n, d) constants, the run's random stream left as it was."""
        with torch.no_grad():
            return self.encode_texts(texts)


__all__ = ["PairsRows"]
