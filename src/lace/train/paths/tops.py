"""The tower-tops path: `TopPairs` (cached maps and token states at the cut) through a trainable `TowersTop`.

One source may run the image side (`NegativeSource.image_pass`: LACE-local with artefact-symmetric counterparts
runs the top once on the real maps, the edits and their counterparts), as on pixels.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lace.encoders.towers.top_features import encode_captions
from lace.train.paths.base import EmbedPath, MicroBatch, source_image_pass
from lace.train.paths.features import check_cached_run


class TopPath(EmbedPath):
    name = "tops"
    where = "train config (cached tower-top inputs)"

    def check(self, given: dict[str, Any]) -> None:
        check_cached_run(self, "encode_image_states", "a TowersTop")

    def describable(self) -> bool:
        return not self.missing_for_descriptions()

    def missing_for_descriptions(self) -> list[str]:
        """What writing the captions of image edits needs and the `TopPairs` lack (`missing_for_descriptions`)."""
        return self.run.pairs.missing_for_descriptions(self.run.config.arm.uses_rule_captions)

    def collate(self, samples: list):
        return self.run.pairs.collate(samples)

    def embed(self, micro: MicroBatch, sources: list) -> None:
        top, pairs, batch = self.run.encoder, self.run.pairs, micro.batch
        micro.maps = batch.maps.to(self.run.device)  # (B, C, H, W), which LACE-local edits
        # a source may run the image side itself (LACE-local with symmetric counterparts: U is the stand-ins)
        micro.U = (source_image_pass(sources, micro) or top.encode_image_states)(micro.maps)
        micro.V = encode_captions(top, pairs.token_states, batch.caption_rows)
        micro.scale = top.logit_scale.exp()
        if pairs.caption_texts is not None:
            micro.captions = [pairs.caption_texts[row] for row in batch.caption_rows]

    def encode_texts(self, texts: list[str]) -> Tensor:
        """Token states made below the cut (`TopPairs.state_encoder`), then the trainable text top, as the cached
        captions take it."""
        states, mask = self.run.pairs.state_encoder(texts)
        return self.run.encoder.encode_text_states(states, mask)
