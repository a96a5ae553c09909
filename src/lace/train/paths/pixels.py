"""The pixels path: images and captions through the whole encoder (any `DualEncoder`), in one joint pass.

Sources may add texts to the pass's text batch (`NegativeSource.pass_texts`: the rule-made captions) and one may
run the image side (`NegativeSource.image_pass`: LACE-local's editor edits inside the tower in the same pass).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from lace.errors import LaceInputError
from lace.train.data import TensorPairs, collate
from lace.train.paths.base import EmbedPath, MicroBatch, source_image_pass


class PixelPath(EmbedPath):
    name = "pixels"

    def describable(self) -> bool:
        return True

    def collate(self, samples: list):
        return collate(samples)

    def embed(self, micro: MicroBatch, sources: list) -> None:
        run, batch = self.run, micro.batch
        n = len(batch.captions)
        texts, spans = batch.captions, {}
        for source in sources:
            extra = source.pass_texts(micro)
            if extra is not None:
                spans[source.name] = (len(texts), len(texts) + len(extra))
                texts = texts + extra
        tokens = run.encoder.tokenize(texts)
        image_pass = source_image_pass(sources, micro)
        with run.autocast():
            U, all_texts, scale = run.model(batch.pixels.to(run.device, non_blocking=True),
                                            tokens.to(run.device, non_blocking=True), encode_images=image_pass)
        all_texts = all_texts.float()
        micro.U, micro.V, micro.scale = U.float(), all_texts[:n], scale.float()  # (B, d), (B, d), ()
        micro.captions, micro.tokens = batch.captions, tokens
        micro.pass_texts = {name: all_texts[start:stop] for name, (start, stop) in spans.items()}

    def encode_texts(self, texts: list[str]) -> Tensor:
        with self.run.autocast():
            return self.run.encoder.encode_texts(texts).float()

    def first_images(self, count: int) -> tuple[Tensor, list[list[str]]]:
        """The first `count` training images (N, 3, H, W) in the model's input format, with their captions."""
        pairs, encoder = self.run.pairs, self.run.encoder
        if isinstance(pairs, TensorPairs):
            count = min(count, len(pairs))
            return pairs.pixels[:count], [list(c) for c in pairs.captions[:count]]
        dataset = pairs.dataset
        count = min(count, len(dataset))
        pixels = torch.stack([encoder.preprocess(dataset.load_image(i)) for i in range(count)])
        return pixels, [list(dataset.records[i].captions) for i in range(count)]

    def scene_ids(self, needed_by: str) -> list[str]:
        """The scene id (image file stem) of every training image; in-memory pairs have none."""
        if isinstance(self.run.pairs, TensorPairs):
            raise LaceInputError(f"train(): {needed_by} with in-memory pairs needs `rendered` passed in")
        return [Path(record.image_path).stem for record in self.run.pairs.dataset.records]
