"""ARO (Yuksekgonul et al., ICLR 2023): VG-Relation, VG-Attribution, COCO-Order, Flickr30k-Order.

Read and scored as the authors' code does (github.com/mertyg/vision-language-models-are-bows:
`dataset_zoo/aro_datasets.py`, `main_aro.py` and the notebook "Replicate ARO! VG-Relation,
VG-Attribution.ipynb"):

- VG-Relation / VG-Attribution: `<root>/visual_genome_relation.json` and
  `<root>/visual_genome_attribution.json` (lists of {"image_path", "bbox_x", "bbox_y",
  "bbox_w", "bbox_h", "true_caption", "false_caption"} plus "relation_name" or
  "attributes"), images in `<root>/images`, each cropped to its box. An item is right
  when the true caption scores strictly above the false one (the authors take the argmax
  over [false, true], so a tie picks the false caption). `vg_relation/macro` is the mean
  accuracy over relations without the authors' fixed list of symmetric relations
  (`SYMMETRIC_RELATIONS`, from the notebook), the figure the paper reports;
  `vg_attribution/macro` the mean over attribute pairs seen at least 25 times. Also
  reported: `vg_relation/macro_all_relations` (every relation) and the micro accuracies.
- COCO-Order / Flickr30k-Order: every caption of a Karpathy test split (BLIP's
  `coco_karpathy_test.json` / `flickr30k_test.json`, which ARO downloads, or Karpathy's
  `dataset_coco.json` / `dataset_flickr30k.json`) against its four perturbations
  (`lace.eval.order_perturbations`), all through BLIP's `pre_caption`. As in the authors'
  argmax over [true, perturbed...], a tie goes to the true caption and every item
  counts, so a perturbation identical to the caption is no loss. `<name>/strict` is
  lace's stricter reading: among items with a perturbation that differs from the
  caption, the share whose caption beats every such perturbation strictly.
  Parts of speech come from the vocabulary by default, or from spaCy as in the
  original (`tagger="spacy"`, needs spaCy and `en_core_web_sm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.data.readers import read_karpathy
from lace.edits.captions import RuleNegatives
from lace.errors import LaceInputError
from lace.eval.benchmarks.base import (
    Benchmark,
    item_field,
    register_benchmark,
    text_field,
)
from lace.eval.embedding_cache import EmbeddingCache, ImageKey
from lace.eval.metrics import macro_accuracy
from lace.eval.order_perturbations import (
    SpacyTagger,
    VocabularyTagger,
    order_perturbations,
    pre_caption,
)
from lace.io import read_json

VG_FILES = {"vg_relation": "visual_genome_relation.json", "vg_attribution": "visual_genome_attribution.json"}
KARPATHY_URL = "cs.stanford.edu/people/karpathy/deepimagesent"
ORDER_TAGGERS = ("vocabulary", "spacy")
ATTRIBUTE_MIN_COUNT = 25  # ARO's VG-Attribution ignores attribute pairs seen fewer times
# Relations the authors leave out of VG-Relation's macro accuracy, verbatim from their
# notebook "Replicate ARO! VG-Relation, VG-Attribution.ipynb".
SYMMETRIC_RELATIONS = frozenset([
    'adjusting', 'attached to', 'between', 'bigger than', 'biting', 'boarding', 'brushing', 'chewing', 'cleaning',
    'climbing', 'close to', 'coming from', 'coming out of', 'contain', 'crossing', 'dragging', 'draped over',
    'drinking', 'drinking from', 'driving', 'driving down', 'driving on', 'eating from', 'eating in', 'enclosing',
    'exiting', 'facing', 'filled with', 'floating in', 'floating on', 'flying', 'flying above', 'flying in',
    'flying over', 'flying through', 'full of', 'going down', 'going into', 'going through', 'grazing in',
    'growing in', 'growing on', 'guiding', 'hanging from', 'hanging in', 'hanging off', 'hanging over',
    'higher than', 'holding onto', 'hugging', 'in between', 'jumping off', 'jumping on', 'jumping over', 'kept in',
    'larger than', 'leading', 'leaning over', 'leaving', 'licking', 'longer than', 'looking in', 'looking into',
    'looking out', 'looking over', 'looking through', 'lying next to', 'lying on top of', 'making', 'mixed with',
    'mounted on', 'moving', 'on the back of', 'on the edge of', 'on the front of', 'on the other side of',
    'opening', 'painted on', 'parked at', 'parked beside', 'parked by', 'parked in', 'parked in front of',
    'parked near', 'parked next to', 'perched on', 'petting', 'piled on', 'playing', 'playing in', 'playing on',
    'playing with', 'pouring', 'reaching for', 'reading', 'reflected on', 'riding on', 'running in', 'running on',
    'running through', 'seen through', 'sitting behind', 'sitting beside', 'sitting by', 'sitting in front of',
    'sitting near', 'sitting next to', 'sitting under', 'skiing down', 'skiing on', 'sleeping in', 'sleeping on',
    'smiling at', 'sniffing', 'splashing', 'sprinkled on', 'stacked on', 'standing against', 'standing around',
    'standing behind', 'standing beside', 'standing in front of', 'standing near', 'standing next to',
    'staring at', 'stuck in', 'surrounding', 'swimming in', 'swinging', 'talking to', 'topped with', 'touching',
    'traveling down', 'traveling on', 'tying', 'typing on', 'underneath', 'wading in', 'waiting for',
    'walking across', 'walking by', 'walking down', 'walking next to', 'walking through', 'working in',
    'working on', 'worn on', 'wrapped around', 'wrapped in', 'by', 'of', 'near', 'next to', 'with', 'beside',
    'on the side of', 'around',
])


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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LaceInputError(f"{path}: item {position}: field '{name}': expected a finite number (got {value!r})")
        values.append(float(value))
    if values[2] <= 0 or values[3] <= 0:  # the crop of an empty box is no image
        raise LaceInputError(f"{path}: item {position}: fields 'bbox_w', 'bbox_h': expected a box of positive "
                             f"size (got {values[2]!r} x {values[3]!r})")
    return tuple(values)  # type: ignore[return-value]


@register_benchmark("aro")
class ARO(Benchmark):
    published_at = "github.com/mertyg/vision-language-models-are-bows"
    image_folder_flag = "--aro-coco-images or --aro-flickr-images (VG: <aro-root>/images)"

    def load(
        self, root: str | Path | None = None, coco_karpathy: str | Path | None = None,
        coco_images: str | Path | None = None, flickr_karpathy: str | Path | None = None,
        flickr_images: str | Path | None = None, vocabulary: str = "natural", seed: int = 0,
        tagger: str = "vocabulary",
    ) -> dict[str, CaptionChoice]:
        """`tagger`: where COCO-/Flickr30k-Order take nouns and adjectives from, "vocabulary"
        (the words of `vocabulary`) or "spacy" (en_core_web_sm, as the authors do)."""
        if root is None and coco_karpathy is None and flickr_karpathy is None:
            raise LaceInputError("aro: nothing to load; give the VG folder (visual_genome_*.json + images/) "
                                 "and/or a Karpathy test JSON for COCO-Order / Flickr30k-Order")
        if tagger not in ORDER_TAGGERS:
            raise LaceInputError(f"aro: unknown tagger {tagger!r}; expected one of {ORDER_TAGGERS}")
        data: dict[str, CaptionChoice] = {}
        if root is not None:
            for name, file_name in VG_FILES.items():
                data[name] = self._load_visual_genome(Path(root), file_name, name)
        order_tagger = None
        for name, path, images in (("coco_order", coco_karpathy, coco_images),
                                   ("flickr30k_order", flickr_karpathy, flickr_images)):
            if path is not None:
                order_tagger = order_tagger or _order_tagger(tagger, vocabulary)
                data[name] = self._load_order(Path(path), images, order_tagger, np.random.default_rng(seed), name)
        return data

    def _load_visual_genome(self, root: Path, file_name: str, name: str) -> CaptionChoice:
        path = self.require_file(root / file_name)
        image_dir = root / "images"
        items = read_json(path, list, "a JSON list of items")
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
        return self.usable(name, choice, [[image] for image, _ in choice.images])

    def _load_order(self, path: Path, image_root, tagger, rng: np.random.Generator, name: str) -> CaptionChoice:
        self.require_file(path, "Karpathy test JSON", KARPATHY_URL)
        captions_per_image = _karpathy_test_captions(path, image_root)
        choice = CaptionChoice()
        for image, captions in captions_per_image:
            for caption in captions:
                choice.images.append((image, None))
                choice.true_captions.append(pre_caption(caption))
                choice.alternatives.append([pre_caption(p) for p in order_perturbations(caption, tagger, rng)])
        return self.usable(name, choice, [[image] for image, _ in choice.images], "cocodataset.org / Flickr30k (images)")

    def score(self, cache: EmbeddingCache, data: dict[str, CaptionChoice]) -> dict[str, float]:
        figures: dict[str, float] = {}
        for name, choice in data.items():
            true_scores, alternative_scores = choice_scores(cache, choice)  # (n,), (n, m)
            if name in VG_FILES:
                correct = true_scores > alternative_scores[:, 0]  # argmax over [false, true]: a tie picks false
                figures[f"{name}/micro"] = float(correct.mean()) if len(correct) else float("nan")
                if name == "vg_relation":
                    kept = np.array([group not in SYMMETRIC_RELATIONS for group in choice.groups], dtype=bool)
                    figures[f"{name}/macro"] = macro_accuracy(correct[kept], np.asarray(choice.groups)[kept])
                    figures[f"{name}/macro_all_relations"] = macro_accuracy(correct, choice.groups)
                else:
                    figures[f"{name}/macro"] = macro_accuracy(correct, choice.groups, ATTRIBUTE_MIN_COUNT)
            else:
                # argmax over [true, perturbed...]: a tie goes to the true caption, every item counts
                wins = true_scores >= alternative_scores.max(axis=1)
                figures[name] = float(wins.mean()) if len(wins) else float("nan")
                differing = _differing_scores(choice, alternative_scores)
                contested = np.isfinite(differing).any(axis=1)
                strict = true_scores[contested] > differing[contested].max(axis=1)
                figures[f"{name}/strict"] = float(strict.mean()) if contested.any() else float("nan")
        return figures


def _order_tagger(tagger: str, vocabulary: str):
    if tagger == "spacy":
        return SpacyTagger()
    return VocabularyTagger(RuleNegatives(load_vocabulary(vocabulary)))


def choice_scores(cache: EmbeddingCache, choice: CaptionChoice) -> tuple[np.ndarray, np.ndarray]:
    """(n,) s(image, true caption) and (n, m) s(image, alternative), m the most alternatives of
    any item (missing ones -inf). An alternative identical to its true caption as text gets
    the true caption's score exactly: the same text, the same score, as in the authors' runs."""
    n = len(choice.true_captions)
    images = cache.images(choice.images)  # (n, d)
    true_scores = (images * cache.texts(choice.true_captions)).sum(-1).numpy().astype(np.float64)  # (n,)
    width = max((len(options) for options in choice.alternatives), default=0)
    alternative_scores = np.full((n, max(width, 1)), -np.inf)
    rows = [r for r, options in enumerate(choice.alternatives) for _ in options]
    columns = [c for options in choice.alternatives for c in range(len(options))]
    texts = [text for options in choice.alternatives for text in options]
    if rows:
        row_index = torch.tensor(rows)
        scores = (images[row_index] * cache.texts(texts)).sum(-1).numpy().astype(np.float64)  # (n_alt,)
        identical = np.array([text == choice.true_captions[r] for r, text in zip(rows, texts)], dtype=bool)
        scores[identical] = true_scores[np.asarray(rows)[identical]]
        alternative_scores[rows, columns] = scores
    return true_scores, alternative_scores


def _differing_scores(choice: CaptionChoice, alternative_scores: np.ndarray) -> np.ndarray:
    """(n, m) alternative scores with those identical to the true caption as text set to -inf."""
    differing = alternative_scores.copy()
    for r, options in enumerate(choice.alternatives):
        for c, text in enumerate(options):
            if text == choice.true_captions[r]:
                differing[r, c] = -np.inf
    return differing


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
