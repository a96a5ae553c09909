"""Zero-shot classification: an image folder with one subfolder per class, or a shapes world.

As CLIP_benchmark scores it (github.com/LAION-AI/CLIP_benchmark,
`clip_benchmark/metrics/zeroshot_classification.py`): each class is the mean of its
prompts' unit text embeddings (every template filled with the class name), renormalised;
each image goes to the class of highest cosine similarity. Reported per task: `top1`,
`top5` (NaN with fewer than five classes) and `mean_per_class_recall`.

Layout, `<root>/<class folder>/<image>` (torchvision's ImageFolder: classes in sorted
folder order, images with a common image suffix). Class names: by default the folder
names with "_" read as spaces; or a file (`classnames`, or `<root>/classnames.json`): a
JSON list in folder order, a JSON object folder -> name, CLIP_benchmark's
`{dataset: [names]}` keyed by the folder's name, or a text file with one name a line.
Templates: `templates`, or `<root>/templates.json`: a JSON list of prompts with "{c}",
CLIP_benchmark's `{dataset: [templates]}` (the folder's name, else "default"), or a text
file with one a line; by default CLIP's single prompt "a photo of a {c}.".

Given a shapes world folder (with `world.json`), its built-in tasks shape, colour and
count (`lace.data.world.zeroshot`) are written on first use and scored as `<task>/top1` ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from lace.data.world.zeroshot import ensure_zeroshot_tasks
from lace.errors import LaceInputError
from lace.eval.benchmarks.base import Benchmark, register_benchmark
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import zeroshot_scores
from lace.io import read_json, read_text

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")
DEFAULT_TEMPLATES = ("a photo of a {c}.",)


@dataclass
class ZeroShotTask:
    """n images with class indices into `classnames`, and the prompts that build each class."""

    image_paths: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    classnames: list[str] = field(default_factory=list)
    templates: list[str] = field(default_factory=list)


@register_benchmark("zeroshot")
class ZeroShot(Benchmark):
    published_at = "any image folder with one subfolder per class (CLIP_benchmark's layout), or `lace world`"

    def load(self, root: str | Path, classnames: str | Path | None = None, templates: str | Path | None = None,
             per_class: int = 20) -> dict[str, ZeroShotTask]:
        """Task name -> task. A world folder gives its shape, colour and count tasks
        (`per_class` images per class); any other folder is one task named after it."""
        root = Path(root)
        if not root.is_dir():
            raise LaceInputError(f"zeroshot: folder not found: {root}; expected one subfolder of images per class, "
                                 f"or a shapes world folder")
        if (root / "world.json").is_file():
            if classnames is not None or templates is not None:
                raise LaceInputError("zeroshot: a world's tasks bring their own class names and templates; "
                                     "drop the class-name and template files")
            tasks_root = ensure_zeroshot_tasks(root, per_class)
            tasks = {task.name: read_image_folder(task) for task in sorted(tasks_root.iterdir()) if task.is_dir()}
        else:
            tasks = {root.name: read_image_folder(root, classnames, templates)}
        return {name: self.usable(name, task, [[path] for path in task.image_paths], fields=("image_paths", "labels"))
                for name, task in tasks.items()}

    def score(self, cache: EmbeddingCache, data: dict[str, ZeroShotTask]) -> dict[str, float]:
        figures = {}
        for name, task in data.items():
            images = cache.images([(path, None) for path in task.image_paths])  # (n, d)
            scores = images @ class_embeddings(cache, task.classnames, task.templates).T  # (n, C)
            figures.update({f"{name}/{key}": value for key, value in zeroshot_scores(scores, task.labels).items()})
        return figures


def class_embeddings(cache: EmbeddingCache, classnames: list[str], templates: list[str]) -> torch.Tensor:
    """(C, d) unit vectors: the mean of each class's prompt embeddings, renormalised."""
    prompts = [template.format(c=name) for name in classnames for template in templates]
    texts = cache.texts(prompts).view(len(classnames), len(templates), -1)  # (C, T, d)
    return F.normalize(texts.mean(dim=1), dim=-1)


def read_image_folder(root: Path, classnames: str | Path | None = None, templates: str | Path | None = None
                      ) -> ZeroShotTask:
    """One task from `<root>/<class>/<image>` and its class names and templates (see the module doc)."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    task = ZeroShotTask()
    for label, folder in enumerate(folders):
        images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        task.image_paths += [str(p) for p in images]
        task.labels += [label] * len(images)
    if len(folders) < 2 or not task.image_paths:
        raise LaceInputError(f"zeroshot: {root}: expected at least two class subfolders holding images "
                             f"({', '.join(IMAGE_SUFFIXES)}); found {len(folders)} folder(s), "
                             f"{len(task.image_paths)} image(s)")
    names = [folder.name for folder in folders]
    classnames = classnames if classnames is not None else _beside(root, "classnames.json")
    templates = templates if templates is not None else _beside(root, "templates.json")
    task.classnames = _read_classnames(Path(classnames), names, root.name) if classnames else [
        name.replace("_", " ") for name in names]
    task.templates = _read_templates(Path(templates), root.name) if templates else list(DEFAULT_TEMPLATES)
    return task


def _beside(root: Path, name: str) -> Path | None:
    return root / name if (root / name).is_file() else None


def _read_lines(path: Path) -> list[str]:
    return [line.strip() for line in read_text(path).splitlines() if line.strip()]


def _read_classnames(path: Path, folders: list[str], dataset: str) -> list[str]:
    value = read_json(path) if path.suffix == ".json" else _read_lines(path)
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        if dataset not in value:
            raise LaceInputError(f"{path}: no class names for {dataset!r} (keys: {sorted(value)[:10]})")
        value = value[dataset]
    if isinstance(value, dict):
        missing = [folder for folder in folders if folder not in value]
        if missing:
            raise LaceInputError(f"{path}: no class name for folder(s) {missing[:5]}")
        value = [value[folder] for folder in folders]
    if not isinstance(value, list) or len(value) != len(folders) or not all(isinstance(v, str) for v in value):
        raise LaceInputError(f"{path}: expected {len(folders)} class names (one per class folder, in sorted "
                             f"order: {folders[:3]}...), as a list, an object folder -> name, or lines of text")
    return value


def _read_templates(path: Path, dataset: str) -> list[str]:
    value = read_json(path) if path.suffix == ".json" else _read_lines(path)
    if isinstance(value, dict):
        value = value.get(dataset, value.get("default"))
    if not isinstance(value, list) or not value or not all(isinstance(t, str) and "{c}" in t for t in value):
        raise LaceInputError(f"{path}: expected prompt templates, each with '{{c}}' for the class name "
                             f"(a JSON list, {{dataset or 'default': [...]}}, or one a line)")
    for template in value:
        try:
            template.format(c="class")
        except (ValueError, IndexError, KeyError, AttributeError) as error:
            raise LaceInputError(f"{path}: template {template!r}: expected '{{c}}' as its only field, other braces "
                                 f"doubled ('{{{{', '}}}}') ({type(error).__name__}: {error})") from error
    return value
