"""ARO (Yuksekgonul et al., ICLR 2023): VG-Relation, VG-Attribution, COCO-Order, Flickr30k-Order.

- VG-Relation / VG-Attribution: `<root>/visual_genome_relation.json` and
  `<root>/visual_genome_attribution.json` (lists of {"image_path", "bbox_x", "bbox_y",
  "bbox_w", "bbox_h", "true_caption", "false_caption"} plus "relation_name" or
  "attributes"), images in `<root>/images`. The image is cropped to the box. Reported as
  ARO does: macro accuracy over relations (all of them) and over attribute pairs seen at
  least 25 times, plus micro accuracy over all items.
- COCO-Order / Flickr30k-Order: built from a Karpathy test split (Karpathy's
  `dataset_coco.json` / `dataset_flickr30k.json`, or the `coco_karpathy_test.json` /
  `flickr30k_test.json` lists ARO downloads); every test caption against its four
  perturbations (`lace.eval.order_perturbations`). Score: share of captions that beat
  every perturbation that differs from them as text (identical options are no contest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.data.readers import read_karpathy
from lace.edits.captions import RuleNegatives
from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.eval.benchmarks.base import (
    Benchmark,
    cache_for,
    item_field,
    read_json_as,
    register_benchmark,
    text_field,
)
from lace.eval.embedding_cache import EmbeddingCache, ImageKey
from lace.eval.metrics import macro_accuracy
from lace.eval.order_perturbations import VocabularyTagger, order_perturbations, pre_caption
from lace.io import read_json

VG_FILES = {"vg_relation": "visual_genome_relation.json", "vg_attribution": "visual_genome_attribution.json"}
KARPATHY_URL = "cs.stanford.edu/people/karpathy/deepimagesent"
ATTRIBUTE_MIN_COUNT = 25  # ARO's VG-Attribution ignores attribute pairs seen fewer times


@dataclass
class CaptionChoice:
    """Items with one image, a true caption and its alternatives (false or perturbed captions)."""

    images: list[ImageKey] = field(default_factory=list)
    true_captions: list[str] = field(default_factory=list)
    alternatives: list[list[str]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    """Relation or attribute pair of each item (VG), for macro accuracy."""


def _box(item: dict, path: Path, position: int) -> tuple[float, float, float, float]:
    values = []
    for name in ("bbox_x", "bbox_y", "bbox_w", "bbox_h"):
        value = item_field(item, name, path, position)
        if not isinstance(value, (int, float)):
            raise LaceInputError(f"{path}: item {position}: field '{name}': expected a number (got {value!r})")
        values.append(float(value))
    return tuple(values)  # type: ignore[return-value]


@register_benchmark("aro")
class ARO(Benchmark):
    published_at = "github.com/mertyg/vision-language-models-are-bows"

    def load(
        self, root: str | Path | None = None, coco_karpathy: str | Path | None = None,
        coco_images: str | Path | None = None, flickr_karpathy: str | Path | None = None,
        flickr_images: str | Path | None = None, vocabulary: str = "natural", seed: int = 0,
    ) -> dict[str, CaptionChoice]:
        if root is None and coco_karpathy is None and flickr_karpathy is None:
            raise LaceInputError("aro: nothing to load; give the VG folder (visual_genome_*.json + images/) "
                                 "and/or a Karpathy test JSON for COCO-Order / Flickr30k-Order")
        data: dict[str, CaptionChoice] = {}
        if root is not None:
            for name, file_name in VG_FILES.items():
                data[name] = self._load_visual_genome(Path(root), file_name, name)
        tagger = None
        for name, path, images in (("coco_order", coco_karpathy, coco_images),
                                   ("flickr30k_order", flickr_karpathy, flickr_images)):
            if path is not None:
                tagger = tagger or VocabularyTagger(RuleNegatives(load_vocabulary(vocabulary)))
                data[name] = self._load_order(Path(path), images, tagger, np.random.default_rng(seed))
        return data

    def _load_visual_genome(self, root: Path, file_name: str, name: str) -> CaptionChoice:
        path = self.require_file(root / file_name)
        image_dir = root / "images"
        items = read_json_as(path, list, "a JSON list of items")
        choice = CaptionChoice()
        for position, item in enumerate(items):
            image = str(image_dir / text_field(item, "image_path", path, position))
            choice.images.append((image, _box(item, path, position)))
            choice.true_captions.append(text_field(item, "true_caption", path, position))
            choice.alternatives.append([text_field(item, "false_caption", path, position)])
            if name == "vg_relation":
                choice.groups.append(text_field(item, "relation_name", path, position))
            else:
                attributes = item_field(item, "attributes", path, position)
                if not isinstance(attributes, list) or len(attributes) != 2:
                    raise LaceInputError(f"{path}: item {position}: field 'attributes': expected a list of two "
                                         f"attributes (got {attributes!r})")
                choice.groups.append(f"{attributes[0]}_{attributes[1]}")
        self.require_images([image for image, _ in choice.images])
        return choice

    def _load_order(self, path: Path, image_root, tagger: VocabularyTagger, rng: np.random.Generator) -> CaptionChoice:
        self.require_file(path, "Karpathy test JSON", KARPATHY_URL)
        captions_per_image = _karpathy_test_captions(path, image_root)
        choice = CaptionChoice()
        for image, captions in captions_per_image:
            for caption in captions:
                choice.images.append((image, None))
                choice.true_captions.append(pre_caption(caption))
                choice.alternatives.append([pre_caption(p) for p in order_perturbations(caption, tagger, rng)])
        self.require_images([image for image, _ in choice.images], "cocodataset.org / Flickr30k (images)")
        return choice

    def evaluate(
        self, encoder: DualEncoder, data: dict[str, CaptionChoice], cache: EmbeddingCache | None = None,
        progress: bool = False,
    ) -> dict[str, float]:
        cache = cache_for(encoder, cache, progress)
        figures: dict[str, float] = {}
        for name, choice in data.items():
            correct, contested = score_choices(cache, choice)
            if name == "vg_relation":
                figures[f"{name}/macro"] = macro_accuracy(correct, choice.groups)
                figures[f"{name}/micro"] = float(correct.mean())
            elif name == "vg_attribution":
                figures[f"{name}/macro"] = macro_accuracy(correct, choice.groups, ATTRIBUTE_MIN_COUNT)
                figures[f"{name}/micro"] = float(correct.mean())
            else:
                figures[name] = float(correct[contested].mean()) if contested.any() else float("nan")
        return figures


def score_choices(cache: EmbeddingCache, choice: CaptionChoice) -> tuple[np.ndarray, np.ndarray]:
    """(n,) bool: the true caption beats every alternative that differs from it as text;
    (n,) bool: the item has at least one such alternative."""
    images = cache.images(choice.images)  # (n, d)
    true_scores = (images * cache.texts(choice.true_captions)).sum(-1)  # (n,)
    rows = [r for r, alternatives in enumerate(choice.alternatives)
            for text in alternatives if text != choice.true_captions[r]]
    texts = [text for r, alternatives in enumerate(choice.alternatives)
             for text in alternatives if text != choice.true_captions[r]]
    correct = np.ones(len(choice.true_captions), dtype=bool)
    contested = np.zeros(len(choice.true_captions), dtype=bool)
    if rows:
        row_index = torch.tensor(rows)
        alternative_scores = (images[row_index] * cache.texts(texts)).sum(-1)  # (n_alt,)
        beaten = (true_scores[row_index] > alternative_scores).numpy()
        np.logical_and.at(correct, rows, beaten)
        contested[rows] = True
    return correct, contested


def _karpathy_test_captions(path: Path, image_root) -> list[tuple[str, list[str]]]:
    """(image path, captions) of the test split: Karpathy's JSON or the BLIP/ARO list format."""
    data = read_json(path)
    if isinstance(data, dict):
        dataset = read_karpathy(path, image_root=image_root, split="test")
        return [(str(record.image_path), list(record.captions)) for record in dataset.records]
    if not isinstance(data, list):
        raise LaceInputError(f"{path}: expected Karpathy's JSON (an object with 'images') or a list of "
                             f"{{'image', 'caption'}} items")
    root = Path(image_root) if image_root is not None else path.parent
    result = []
    for position, item in enumerate(data):
        image = text_field(item, "image", path, position)
        captions = item_field(item, "caption", path, position)
        captions = [captions] if isinstance(captions, str) else captions
        if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
            raise LaceInputError(f"{path}: item {position}: field 'caption': expected a list of strings")
        result.append((str(root / image), captions))
    return result
