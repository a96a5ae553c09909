"""Items scored by pairwise accuracy: one image, its caption and one negative caption each."""

from __future__ import annotations

from dataclasses import dataclass, field

from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import pairwise_accuracy


@dataclass
class PairItems:
    """n items: image_paths[i] with captions[i] (true) and negatives[i] (false)."""

    image_paths: list[str] = field(default_factory=list)
    captions: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)


def score_pairs(cache: EmbeddingCache, items: PairItems) -> float:
    """Share of items where the image scores its caption strictly above the negative."""
    images = cache.images([(path, None) for path in items.image_paths])  # (n, d)
    captions, negatives = cache.texts(items.captions), cache.texts(items.negatives)
    return pairwise_accuracy((images * captions).sum(-1), (images * negatives).sum(-1))
