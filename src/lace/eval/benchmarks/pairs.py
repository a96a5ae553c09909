"""Items scored by pairwise accuracy: one image, its caption and one negative caption each.

Swap items are also split by their words (SugarCrepe issue 10, 2026): when a caption and its negative hold
the same multiset of words ("a red cube and a blue ball" / "a blue cube and a red ball"), a text tower
blind to word order scores the pair at chance, so their accuracy is reported apart from the rest's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from lace.concepts.mentions import words
from lace.eval.embedding_cache import EmbeddingCache


@dataclass
class PairItems:
    """n items: image_paths[i] with captions[i] (true) and negatives[i] (false)."""

    image_paths: list[str] = field(default_factory=list)
    captions: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)


def pair_scores(cache: EmbeddingCache, items: PairItems) -> tuple[Tensor, Tensor]:
    """(n,) s(image, caption) and (n,) s(image, negative)."""
    images = cache.images([(path, None) for path in items.image_paths])  # (n, d)
    captions, negatives = cache.texts(items.captions), cache.texts(items.negatives)
    return (images * captions).sum(-1), (images * negatives).sum(-1)


def same_words(caption: str, negative: str) -> bool:
    """Whether two captions hold the same multiset of words (lower-cased; punctuation and spacing ignored)."""
    return Counter(word for word, _, _ in words(caption)) == Counter(word for word, _, _ in words(negative))


def same_words_split(correct, captions: list[str], negatives: list[str], prefix: str) -> dict[str, float]:
    """Accuracy of (n,) bool `correct` over the items whose caption and negative hold the same words
    (`<prefix>/same_words`) and over the others (`<prefix>/other`), NaN for a part with no item; and the
    share of same-words items (`<prefix>/same_words_share`)."""
    correct = np.asarray(correct, dtype=bool)
    same = np.array([same_words(c, n) for c, n in zip(captions, negatives, strict=True)], dtype=bool)
    if same.shape != correct.shape:
        raise ValueError(f"correct: expected one value per item ({same.shape[0]}), got shape {correct.shape}")

    def accuracy(mask: np.ndarray) -> float:
        return float(correct[mask].mean()) if mask.any() else float("nan")

    return {f"{prefix}/same_words": accuracy(same), f"{prefix}/other": accuracy(~same),
            f"{prefix}/same_words_share": float(same.mean()) if same.size else float("nan")}
