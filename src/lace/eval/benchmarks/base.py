"""The contract every benchmark follows, and the registry that names them.

A benchmark reads its original release format with `load(root, **options)` and scores
an encoder with `evaluate(encoder, data, cache, progress) -> {metric: value}`. Embedding
goes through an `EmbeddingCache`, so each image and caption is embedded once per run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.eval.embedding_cache import EmbeddingCache
from lace.io import read_json

BENCHMARKS: dict[str, type[Benchmark]] = {}


class Benchmark(ABC):
    """One compositional or retrieval benchmark."""

    name: ClassVar[str]
    published_at: ClassVar[str]
    """Where the original release can be downloaded (named in missing-file errors)."""

    @abstractmethod
    def load(self, root: str | Path, **options: Any) -> Any:
        """Read the benchmark from its original files under `root`."""

    @abstractmethod
    def evaluate(
        self, encoder: DualEncoder, data: Any, cache: EmbeddingCache | None = None, progress: bool = False
    ) -> dict[str, float]:
        """Score `encoder` on loaded `data`: a flat {metric: value} dict."""

    def missing(self, path: str | Path, what: str = "file", published_at: str | None = None) -> LaceInputError:
        """The error for a missing file: what is missing, where it was looked for, where to get it."""
        path = Path(path)
        return LaceInputError(
            f"{self.name}: {what} {path.name!r} not found in {path.parent} (looked for {path}); "
            f"the original is published at {published_at or self.published_at}"
        )

    def require_file(self, path: str | Path, what: str = "file", published_at: str | None = None) -> Path:
        path = Path(path)
        if not path.is_file():
            raise self.missing(path, what, published_at)
        return path

    def require_images(self, paths, published_at: str | None = None) -> None:
        """Check every image exists before any embedding starts (an early, precise error)."""
        for path in dict.fromkeys(str(p) for p in paths):
            if not Path(path).is_file():
                raise self.missing(path, "image", published_at)


def register_benchmark(name: str) -> Callable[[type[Benchmark]], type[Benchmark]]:
    """Class decorator: make a `Benchmark` subclass available by `name`."""
    def decorator(cls: type[Benchmark]) -> type[Benchmark]:
        cls.name = name
        BENCHMARKS[name] = cls
        return cls
    return decorator


def get_benchmark(name: str) -> Benchmark:
    """A fresh instance of the benchmark registered as `name`."""
    if name not in BENCHMARKS:
        raise LaceInputError(f"unknown benchmark {name!r}; expected one of {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]()


def cache_for(encoder: DualEncoder, cache: EmbeddingCache | None, progress: bool) -> EmbeddingCache:
    return cache if cache is not None else EmbeddingCache(encoder, progress=progress)


def read_json_as(path: Path, kind: type, expected: str) -> Any:
    """The JSON at `path`, refused unless its top level is a `kind` (dict or list) as `expected` says."""
    value = read_json(path)
    if not isinstance(value, kind):
        raise LaceInputError(f"{path}: expected {expected} (got {type(value).__name__})")
    return value


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
