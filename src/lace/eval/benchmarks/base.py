"""The contract every benchmark follows, and the registry that names them.

A benchmark reads its original release format with `load(root, **options)` and scores
an encoder with `evaluate(encoder, data, cache, progress) -> {metric: value}`, which hands its own
`score(cache, data)` an `EmbeddingCache`, so each image and caption is embedded once per run.

Images go through one policy (`lace.data.images`): `missing_images = "error"` stops on the first file
that is missing or unreadable, naming it; "skip" scores the items whose images are all usable. Either way
`item_counts` holds, per part (file) of the benchmark, the items scored and skipped, and `image_checks`
what was found.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from lace.data.images import ImageCheck, merge_checks, usable_items, validate_policy
from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.eval.embedding_cache import EmbeddingCache

BENCHMARKS: dict[str, type[Benchmark]] = {}
ItemsT = TypeVar("ItemsT")


class Benchmark(ABC):
    """One compositional or retrieval benchmark."""

    name: ClassVar[str]
    published_at: ClassVar[str | None]
    """Where the original release can be downloaded (named in missing-file errors; None for a user's own data)."""
    image_folder_flag: ClassVar[str] = "the benchmark's image folder"
    """What names the folder its image paths are relative to (said when none of its images exist)."""

    def __init__(self, missing_images: str = "error"):
        self.missing_images = missing_images
        """Images missing or unreadable: "error" or "skip" (score the items whose images are usable)."""
        self.item_counts: dict[str, dict[str, int]] = {}
        """Part (file) of the benchmark -> {"scored": items, "skipped": items left out for their images}."""
        self.image_checks: list[ImageCheck] = []

    @abstractmethod
    def load(self, root: str | Path, **options: Any) -> Any:
        """Read the benchmark from its original files under `root`."""

    def evaluate(
        self, encoder: DualEncoder, data: Any, cache: EmbeddingCache | None = None, progress: bool = False
    ) -> dict[str, float]:
        """Score `encoder` on loaded `data`: a flat {metric: value} dict (embeddings through `cache`, a fresh
        one by default)."""
        return self.score(cache if cache is not None else EmbeddingCache(encoder, progress=progress), data)

    @abstractmethod
    def score(self, cache: EmbeddingCache, data: Any) -> dict[str, float]:
        """The figures of loaded `data`, its images and captions embedded through `cache`."""

    def missing(self, path: str | Path, what: str = "file", published_at: str | None = None) -> LaceInputError:
        """The error for a missing file: what is missing, where it was looked for, where to get it."""
        path = Path(path)
        published_at = published_at or self.published_at
        return LaceInputError(
            f"{self.name}: {what} {path.name!r} not found in {path.parent} (looked for {path})"
            + (f"; the original is published at {published_at}" if published_at else "")
        )

    def require_file(self, path: str | Path, what: str = "file", published_at: str | None = None) -> Path:
        path = Path(path)
        if not path.is_file():
            raise self.missing(path, what, published_at)
        return path

    def usable(self, part: str, items: ItemsT, item_images: list[list[str]], published_at: str | None = None,
               fields: tuple[str, ...] | None = None) -> ItemsT:
        """`items` (a dataclass of per-item lists, `item_images[i]` the image files of item i) with only the items
        whose images are usable under `missing_images`, checked before any embedding starts; counted under `part`.
        `fields`: the per-item lists (default: every list as long as the first)."""
        published_at = published_at or self.published_at
        hint = f"{self.name}'s images are published at {published_at}" if published_at else None
        keep, check = usable_items(item_images, self.missing_images, f"{self.name} {part}", hint=hint,
                                   require_some=False, folder_flag=self.image_folder_flag)
        self.image_checks.append(check)
        self.item_counts[part] = {"scored": len(keep), "skipped": len(item_images) - len(keep)}
        return items if len(keep) == len(item_images) else subset_items(items, keep, fields)

    def image_summary(self) -> str | None:
        """One line on the images left out and the items scored and skipped (None when nothing was left out);
        a `LaceInputError` when no item is left to score."""
        check = merge_checks(self.image_checks, self.name)
        scored = sum(counts["scored"] for counts in self.item_counts.values())
        skipped = sum(counts["skipped"] for counts in self.item_counts.values())
        if skipped and not scored:
            raise check.error(f"{self.name}: no item is left to score", self.image_folder_flag)
        if not check.bad:
            return None
        return f"{check.summary()}; scored {scored} items, skipped {skipped}"


def register_benchmark(name: str) -> Callable[[type[Benchmark]], type[Benchmark]]:
    """Class decorator: make a `Benchmark` subclass available by `name`."""
    def decorator(cls: type[Benchmark]) -> type[Benchmark]:
        cls.name = name
        BENCHMARKS[name] = cls
        return cls
    return decorator


def get_benchmark(name: str, missing_images: str = "error") -> Benchmark:
    """A fresh instance of the benchmark registered as `name`; `missing_images`: "error" or "skip"."""
    if name not in BENCHMARKS:
        raise LaceInputError(f"unknown benchmark {name!r}; expected one of {sorted(BENCHMARKS)}")
    return BENCHMARKS[name](validate_policy(missing_images))


def item_field(item: object, name: str, where: object, position: object) -> Any:
    """`item[name]`, or an error naming the file, the item and the missing field."""
    if not isinstance(item, dict) or name not in item:
        raise LaceInputError(f"{where}: item {position}: field '{name}' missing")
    return item[name]


def text_field(item: object, name: str, where: object, position: object) -> str:
    value = item_field(item, name, where, position)
    if not isinstance(value, str) or not value.strip():
        raise LaceInputError(f"{where}: item {position}: field '{name}': expected a non-empty string (got {value!r})")
    return value


def subset_items(items: ItemsT, keep: list[int], fields: tuple[str, ...] | None = None) -> ItemsT:
    """A copy of dataclass `items` whose per-item list `fields` (default: the lists as long as the first) keep the
    rows `keep`."""
    lists = {f.name: getattr(items, f.name) for f in dataclasses.fields(items)
             if isinstance(getattr(items, f.name), list) and (fields is None or f.name in fields)}
    n = len(next(iter(lists.values())))
    return dataclasses.replace(items, **{name: [values[i] for i in keep]
                                         for name, values in lists.items() if len(values) == n})
