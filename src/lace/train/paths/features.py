"""The cached-features path: `FeaturePairs` (pooled tower features) through the heads of a `lace-towers` encoder."""

from __future__ import annotations

from typing import Any

from lace.errors import LaceInputError
from lace.train.paths.base import EmbedPath, MicroBatch


class FeaturePath(EmbedPath):
    name = "features"
    where = "train config (cached tower features)"

    def check(self, given: dict[str, Any]) -> None:
        check_cached_run(self, "forward_features", "a lace-towers encoder")

    def collate(self, samples: list):
        return self.run.pairs.collate(samples)

    def embed(self, micro: MicroBatch, sources: list) -> None:
        batch, device = micro.batch, self.run.device
        micro.U, micro.V, micro.scale = self.run.encoder.forward_features(batch.image_features.to(device),
                                                                          batch.text_features.to(device))


def check_cached_run(path: EmbedPath, method: str, expected: str) -> None:
    """Refuse a cached run whose encoder lacks `method` or that runs in more than one process."""
    encoder, context = path.run.encoder, path.run.context
    if not hasattr(encoder, method):
        raise LaceInputError(f"{path.where}: field 'model': expected {expected} passed in, "
                             f"got {type(encoder).__name__}")
    if context.enabled:
        raise LaceInputError(f"{path.where}: expected one process (got {context.world_size})")
