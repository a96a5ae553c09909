"""The ceiling (shapes world only): each training scene re-rendered with two objects' colours swapped, encoded by
the image tower, a text->image negative (`rendered_negatives`; `lace.train.rendered`)."""

from __future__ import annotations

from typing import Any

from lace.train.negatives import Negatives
from lace.train.paths.base import EmbedPath, MicroBatch, Run
from lace.train.rendered import rendered_negatives, world_of
from lace.train.sources.base import NegativeSource


class RenderedCeiling(NegativeSource):
    name = "rendered ceiling"
    switch = "rendered_negatives"
    paths = ("pixels",)

    def __init__(self, run: Run, path: EmbedPath, given: dict[str, Any]):
        super().__init__(run, path, given)
        self.rendered = given.get("rendered")
        if self.rendered is None:
            self.rendered = rendered_negatives(world_of(self.config.run.data), path.scene_ids("rendered_negatives"),
                                               run.encoder.preprocess)

    def embed(self, micro: MicroBatch) -> None:
        run, indices = self.run, micro.batch.indices
        rendered, valid = self.rendered.batch(indices)
        with run.autocast():
            embeddings = run.encoder.encode_images(rendered.to(run.device)).float()  # (B, d)
        self.made = (embeddings[:, None], valid.to(run.device))

    def negatives(self, micro: MicroBatch, negatives: Negatives) -> None:
        indices = micro.batch.indices
        negatives.add_image_edits(*self.made, self.config.arm.edited_image_columns,
                                  self.describe_edits(micro, lambda: self.rendered.batch_changes(indices)))
