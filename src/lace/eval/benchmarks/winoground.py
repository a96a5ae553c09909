"""Winoground (Thrush et al., CVPR 2022): two images, two captions with the same words.

Layout of the Hugging Face release: `<root>/examples.jsonl` (one JSON object per line
with "id", "caption_0", "caption_1", "image_0", "image_1") and `<root>/images/<image>.png`.
Text, image and group scores exactly as the paper defines them and the release's scoring
computes them (`winoground_scores`: strict comparisons, so ties fail); all examples count and
the tags are not used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lace.errors import LaceInputError
from lace.eval.benchmarks.base import Benchmark, register_benchmark, text_field
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import winoground_scores
from lace.io import read_text


@dataclass
class WinogroundItems:
    """n examples: image_paths[i] = (image_0, image_1), captions[i] = (caption_0, caption_1)."""

    ids: list[str] = field(default_factory=list)
    image_paths: list[tuple[str, str]] = field(default_factory=list)
    captions: list[tuple[str, str]] = field(default_factory=list)


def winoground_score_tensor(cache: EmbeddingCache, items: WinogroundItems) -> torch.Tensor:
    """(n, 2, 2) similarities s[i, c, m] = s(caption_c, image_m)."""
    images = cache.images([(p, None) for pair in items.image_paths for p in pair]).view(-1, 2, cache.encoder.embed_dim)
    texts = cache.texts([c for pair in items.captions for c in pair]).view(-1, 2, cache.encoder.embed_dim)
    return torch.einsum("ncd,nmd->ncm", texts, images)


def add_quadruple(items: WinogroundItems, example: object, where: object, position: object, default_id: object,
                  image_path: Callable[[str], str]) -> None:
    """Append one example with "id" (else `default_id`), "image_0", "image_1" (each a path by `image_path`),
    "caption_0" and "caption_1" to `items`; a missing field is an error naming `where` and `position`."""
    items.ids.append(str(example.get("id", default_id)) if isinstance(example, dict) else "")
    items.image_paths.append(tuple(image_path(text_field(example, f"image_{j}", where, position)) for j in (0, 1)))
    items.captions.append(tuple(text_field(example, f"caption_{j}", where, position) for j in (0, 1)))


@register_benchmark("winoground")
class Winoground(Benchmark):
    published_at = "huggingface.co/datasets/facebook/winoground"

    def load(self, root: str | Path) -> WinogroundItems:
        root = Path(root)
        path = self.require_file(root / "examples.jsonl")
        items = WinogroundItems()
        for line_number, line in enumerate(read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                example = json.loads(line)
            except json.JSONDecodeError as error:
                raise LaceInputError(f"{path}:{line_number}: not valid JSON ({error})") from error
            add_quadruple(items, example, f"{path}:{line_number}", "line", line_number - 1,
                          lambda image: str(root / "images" / f"{image}.png"))
        if not items.ids:
            raise LaceInputError(f"{path}: no examples")
        return self.usable("examples", items, [list(pair) for pair in items.image_paths])

    def score(self, cache: EmbeddingCache, data: WinogroundItems) -> dict[str, float]:
        return winoground_scores(winoground_score_tensor(cache, data))
