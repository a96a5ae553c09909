"""Zero-shot classification on Flickr8k, which has no class labels: a task derived from the captions.

A proxy, not a benchmark: the classes are the study vocabulary's objects; a test image belongs to
a class when that object is the only one named by at least `CONSENSUS` of its captions (4 of
Flickr8k's 5: the annotators agree on it and on no other object; images without such an object
are left out); classes with fewer than `MIN_IMAGES` such images are dropped. Requiring every
caption to name that object and no caption to name another leaves almost nothing on Flickr8k
(17 test images, 2 classes), since one of five annotators usually mentions the ground or a person. Each class
is the mean of its prompts' unit text embeddings, as CLIP_benchmark builds them
(`lace.eval.benchmarks.zeroshot`). Scored as the `zeroshot` measurement: `zeroshot/captions/top1`,
`top5` and `mean_per_class_recall`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from lace.concepts.directions import mention_matrix
from lace.concepts.image_mentions import image_mentions
from lace.concepts.vocabulary import Vocabulary
from lace.eval.measure import MeasureConfig, MeasuredSplit, register
from lace.eval.metrics import zeroshot_scores
from lace.study.features import SplitFeatures

MIN_IMAGES = 5
CONSENSUS = 0.8
"""Share of an image's captions that must name its class (4 of 5)."""
TEMPLATES = ("a photo of a {c}.", "a picture of a {c}.")
TASK = "captions"


@dataclass
class CaptionTask:
    """`classes` (C names), `image_rows` (n,) test images in the task, `labels` (n,) their class, and the
    images a class needed to be kept."""

    classes: list[str] = field(default_factory=list)
    image_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    min_images: int = MIN_IMAGES

    def prompts(self) -> list[str]:
        """C x T prompts, class by class."""
        return [template.format(c=name) for name in self.classes for template in TEMPLATES]

    def summary(self) -> dict:
        counts = np.bincount(self.labels, minlength=len(self.classes)) if len(self.classes) else np.zeros(0)
        return {"classes": self.classes, "images": len(self.image_rows),
                "images_per_class": {name: int(n) for name, n in zip(self.classes, counts)},
                "templates": list(TEMPLATES), "min_images": self.min_images,
                "consensus": CONSENSUS}


def caption_task(vocabulary: Vocabulary, split: SplitFeatures, min_images: int = MIN_IMAGES) -> CaptionTask:
    """The caption-derived task of `split` (see the module's docstring): needs `captions`,
    `caption_image_index` and `image_paths`."""
    objects = Vocabulary("objects", vocabulary.of_kind("object"))
    captions_of = np.bincount(split.caption_image_index, minlength=len(split.image_paths))  # (N_img,)
    naming = image_mentions(split.captions, split.caption_image_index, len(split.image_paths),
                            partial(mention_matrix, objects), len(objects.concepts))  # captions naming each object
    agreed = naming >= np.maximum(1, np.ceil(CONSENSUS * captions_of - 1e-9))[:, None]  # (N_img, C)
    single = {int(image): int(np.flatnonzero(agreed[image])[0]) for image in np.flatnonzero(agreed.sum(axis=1) == 1)}
    counts = np.bincount(list(single.values()), minlength=len(objects.concepts)) if single else np.zeros(0, int)
    kept = [i for i, n in enumerate(counts) if n >= min_images]
    column = {concept: k for k, concept in enumerate(kept)}
    images = sorted(image for image, concept in single.items() if concept in column)
    return CaptionTask([objects.concepts[i].name for i in kept], np.array(images, dtype=np.int64),
                       np.array([column[single[image]] for image in images], dtype=np.int64), min_images)


def class_embeddings(prompt_embeddings: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(C, d) unit class embeddings from (C * T, d) unit prompt embeddings, class by class."""
    grouped = prompt_embeddings.reshape(n_classes, -1, prompt_embeddings.shape[-1])
    return F.normalize(F.normalize(grouped, dim=-1).mean(dim=1), dim=-1)


@register("zeroshot")
def _zeroshot(split: MeasuredSplit, config: MeasureConfig, inputs: dict) -> dict:
    """`zeroshot/captions/*` of input `zeroshot_task` (a `CaptionTask`) against input `zeroshot_classes` (C, d)."""
    task, classes = inputs.get("zeroshot_task"), inputs.get("zeroshot_classes")
    if task is None or classes is None or not task.classes:
        return {}
    scores = split.images[torch.as_tensor(task.image_rows)] @ classes.T  # (n, C)
    figures = zeroshot_scores(scores, task.labels)
    return {f"zeroshot/{TASK}/{name}": (None if np.isnan(value) else float(value)) for name, value in figures.items()}
