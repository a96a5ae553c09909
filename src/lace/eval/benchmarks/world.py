"""The shapes world's binding benchmarks (folder written by `lace world`).

- `benchmarks/<split>.json`: items {"family", "filename", "caption", "negative_caption",
  "negative_filename"}, paths relative to the world folder. Both directions per family:
  i2t, s(image, caption) > s(image, negative_caption); t2i, s(caption, image) >
  s(caption, negative_image). Swap families are also split by words (`pairs.same_words_split`):
  `<direction>/<family>/same_words` where caption and negative caption hold the same multiset of words,
  `<direction>/<family>/other` for the rest, and `<direction>/<family>/same_words_share`.
- `benchmarks/<split>_winoground.json`: {"id", "image_0", "image_1", "caption_0",
  "caption_1"} with caption_i describing image_i; Winoground's text, image, group scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lace.data.world.benchmarks import SWAP_FAMILIES
from lace.eval.benchmarks.base import (
    Benchmark,
    register_benchmark,
    text_field,
)
from lace.eval.benchmarks.pairs import same_words_split
from lace.eval.benchmarks.winoground import WinogroundItems, add_quadruple, winoground_score_tensor
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import group_accuracy, winoground_scores
from lace.io import read_json
from lace.manifest import verify


@dataclass
class WorldItems:
    """Binding items of one split (absolute image paths) and its Winoground quadruples."""

    families: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    negative_images: list[str] = field(default_factory=list)
    captions: list[str] = field(default_factory=list)
    negative_captions: list[str] = field(default_factory=list)
    winoground: WinogroundItems = field(default_factory=WinogroundItems)


def binding_correct(cache: EmbeddingCache, data: WorldItems) -> tuple[np.ndarray, np.ndarray]:
    """(n,) bool per binding item, image->text (the caption beats the negative caption for the image) and
    text->image (the image beats the negative image for the caption)."""
    images = cache.images([(p, None) for p in data.images])  # (n, d)
    negative_images = cache.images([(p, None) for p in data.negative_images])
    captions, negative_captions = cache.texts(data.captions), cache.texts(data.negative_captions)
    positive = (images * captions).sum(-1)  # (n,) s(image, caption)
    i2t = (positive > (images * negative_captions).sum(-1)).numpy()
    t2i = (positive > (captions * negative_images).sum(-1)).numpy()
    return i2t, t2i


@register_benchmark("world")
class World(Benchmark):
    published_at = "`lace world --out DIR` (generated locally)"

    def load(self, root: str | Path, split: str = "test") -> WorldItems:
        root = Path(root)
        verify(root, (f"benchmarks/{split}.json", f"benchmarks/{split}_winoground.json"))
        path = self.require_file(root / "benchmarks" / f"{split}.json", "binding items file")
        items = read_json(path, list, "a JSON list of binding items")
        data = WorldItems()
        for position, item in enumerate(items):
            data.families.append(text_field(item, "family", path, position))
            data.images.append(str(root / text_field(item, "filename", path, position)))
            data.negative_images.append(str(root / text_field(item, "negative_filename", path, position)))
            data.captions.append(text_field(item, "caption", path, position))
            data.negative_captions.append(text_field(item, "negative_caption", path, position))
        wino_path = self.require_file(root / "benchmarks" / f"{split}_winoground.json", "Winoground file")
        quadruples = read_json(wino_path, list, "a JSON list")
        for position, item in enumerate(quadruples):
            add_quadruple(data.winoground, item, wino_path, position, position, lambda image: str(root / image))
        data = self.usable("binding", data, [list(pair) for pair in zip(data.images, data.negative_images)])
        data.winoground = self.usable("winoground", data.winoground, [list(pair) for pair in data.winoground.image_paths])
        return data

    def score(self, cache: EmbeddingCache, data: WorldItems) -> dict[str, float]:
        i2t, t2i = binding_correct(cache, data)
        figures: dict[str, float] = {}
        for direction, correct in (("i2t", i2t), ("t2i", t2i)):
            figures.update({f"{direction}/{family}": value for family, value in group_accuracy(correct, data.families).items()})
            figures[f"{direction}/all"] = float(np.mean(correct)) if len(correct) else float("nan")
            for family in sorted(set(data.families) & set(SWAP_FAMILIES)):
                rows = [i for i, f in enumerate(data.families) if f == family]
                figures.update(same_words_split(correct[rows], [data.captions[i] for i in rows],
                                                [data.negative_captions[i] for i in rows], f"{direction}/{family}"))
        if data.winoground.ids:
            scores = winoground_scores(winoground_score_tensor(cache, data.winoground))
            figures.update({f"winoground/{name}": value for name, value in scores.items()})
        return figures
