"""LACE-local's caption swaps: two concept words' token states swapped at `local.text_layer` inside the text tower,
image->text negatives (`local_caption_swaps`; pixels only: the cached paths have no tokens to swap)."""

from __future__ import annotations

from typing import Any

from lace.concepts.vocabulary import load_vocabulary
from lace.train.local_arm import group_token_ids, local_caption_negatives
from lace.train.negatives import Negatives
from lace.train.paths.base import EmbedPath, MicroBatch, Run
from lace.train.sources.base import NegativeSource


class LocalCaptionSwaps(NegativeSource):
    name = "local caption swaps"
    switch = "local_caption_swaps"
    paths = ("pixels",)

    def __init__(self, run: Run, path: EmbedPath, given: dict[str, Any]):
        super().__init__(run, path, given)
        self.concept_token_ids = group_token_ids(run.encoder.tokenize, load_vocabulary(self.config.run.vocabulary),
                                                 self.config.negatives.local.group)

    def embed(self, micro: MicroBatch) -> None:
        run = self.run
        with run.autocast():
            embeddings, valid = local_caption_negatives(run.encoder.model, micro.tokens.to(run.device),
                                                        self.concept_token_ids, self.config.negatives.local.text_layer)
        self.made = (embeddings.float(), valid.to(run.device))

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        negatives.add_captions(*self.made)
