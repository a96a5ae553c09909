"""Tower features of Flickr8k, computed once and cached, split into train / val / test.

With the towers locked every model of the study is a pair of heads on these features,
so the towers run once per image and per caption (and once per rule-made caption).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lace.data.dataset import ImageTextDataset
from lace.data.flickr8k import SPLITS
from lace.edits.captions import RuleNegatives
from lace.encoders.towers import (
    TowersDualEncoder,
    cached_image_tower_features,
    cached_text_tower_features,
)
from lace.errors import LaceInputError
from lace.experiment.stages import stage_key
from lace.io import atomic_write_json, read_json


@dataclass
class SplitFeatures:
    """Tower features of one split.

    image_features: (N_img, 1280); text_features: (N_txt, 384); caption_image_index:
    (N_txt,) image row (within the split) of each caption; image_paths: N_img files.
    """

    name: str
    image_features: torch.Tensor
    text_features: torch.Tensor
    captions: list[str]
    caption_image_index: np.ndarray
    image_paths: list[str]

    @property
    def captions_per_image(self) -> list[list[str]]:
        return captions_by_image(self.captions, self.caption_image_index, len(self.image_paths))


def captions_by_image(captions: Sequence[str], caption_image_index: np.ndarray, n_images: int) -> list[list[str]]:
    """The captions of each of `n_images` images, in caption order; caption_image_index: (N_txt,) their images."""
    grouped: list[list[str]] = [[] for _ in range(n_images)]
    for caption, owner in zip(captions, caption_image_index):
        grouped[owner].append(caption)
    return grouped


def split_rows(dataset: ImageTextDataset) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per split of Flickr8k (`SPLITS`, records tagged with one): its image rows (N_img,), its captions' rows
    (N_txt,) and each of those captions' image row within the split (N_txt,)."""
    owner = np.asarray(dataset.caption_image_index, dtype=np.int64)
    found = {}
    for name in SPLITS:
        rows = np.array([i for i, record in enumerate(dataset.records) if record.split == name], dtype=np.int64)
        local = np.full(len(dataset), -1, dtype=np.int64)
        local[rows] = np.arange(rows.size)
        keep = np.flatnonzero(local[owner] >= 0)
        found[name] = (rows, keep, local[owner[keep]])
    return found


def throughput_record_path(cache_dir: str | Path, dataset: ImageTextDataset) -> Path:
    """Where the extraction throughput of `dataset`'s features is kept, beside the features."""
    key = stage_key([str(r.image_path) for r in dataset.records], len(dataset.captions))
    return Path(cache_dir) / f"extraction-{key}.json"


def write_throughput_record(cache_dir: str | Path, dataset: ImageTextDataset, image_seconds: float,
                            caption_seconds: float) -> dict:
    """Record how long the tower pass over `dataset` took (images/s, captions/s)."""
    record = {
        "images": len(dataset), "captions": len(dataset.captions),
        "image_seconds": image_seconds, "caption_seconds": caption_seconds,
        "images_per_second": len(dataset) / max(image_seconds, 1e-9),
        "captions_per_second": len(dataset.captions) / max(caption_seconds, 1e-9),
        "torch_threads": torch.get_num_threads(),
    }
    atomic_write_json(throughput_record_path(cache_dir, dataset), record)
    return record


def _written_since(array: np.ndarray, since: float) -> bool:
    """True when the memory-mapped file behind `array` was written at or after `since` (time.time())."""
    filename = getattr(array, "filename", None)
    return filename is not None and Path(filename).stat().st_mtime >= since


def dataset_features(
    encoder: TowersDualEncoder, dataset: ImageTextDataset, cache_dir: str | Path,
    image_batch_size: int = 64, num_workers: int = 1, progress: bool = False,
) -> tuple[dict[str, SplitFeatures], dict]:
    """Tower features of every image and caption of `dataset` (records tagged with a split),
    through the on-disk cache, and the extraction throughput.

    The throughput (images/s, captions/s) is measured when the features are computed and
    kept beside them (`write_throughput_record`), so a later study reading the cache still
    reports it, with `computed_in_this_run` false; features cached without a record give
    None figures rather than the speed of a cache read.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    run_started = time.time()
    started = time.perf_counter()
    images = cached_image_tower_features(encoder, dataset, cache_dir, image_batch_size, num_workers, progress)
    image_seconds = time.perf_counter() - started
    started = time.perf_counter()
    texts = cached_text_tower_features(encoder, dataset.captions, cache_dir, progress=progress)
    text_seconds = time.perf_counter() - started
    record_path = throughput_record_path(cache_dir, dataset)
    if _written_since(images, run_started) and _written_since(texts, run_started):
        throughput = {**write_throughput_record(cache_dir, dataset, image_seconds, text_seconds),
                      "computed_in_this_run": True}
    elif record_path.is_file():
        throughput = {**read_json(record_path), "computed_in_this_run": False}
    else:
        throughput = {"images": len(dataset), "captions": len(dataset.captions), "image_seconds": None,
                      "caption_seconds": None, "images_per_second": None, "captions_per_second": None,
                      "computed_in_this_run": False}
    splits = {}
    for name, (rows, keep, owner) in split_rows(dataset).items():
        if rows.size == 0:
            raise LaceInputError(f"{dataset.source}: split {name!r} holds no images; the study needs all of {SPLITS}")
        splits[name] = SplitFeatures(
            name=name,
            image_features=torch.from_numpy(np.array(images[rows], dtype=np.float32)),
            text_features=torch.from_numpy(np.array(texts[keep], dtype=np.float32)),
            captions=[dataset.captions[i] for i in keep],
            caption_image_index=owner,
            image_paths=[str(dataset.records[i].image_path) for i in rows],
        )
    return splits, throughput


def rule_negative_captions(rules: RuleNegatives, captions: Sequence[str], seed: int = 0) -> tuple[list[str], np.ndarray]:
    """One rule-made negative per caption, drawn with an rng seeded by (seed, row).

    Returns the N negatives (a caption without an applicable rule repeats itself) and
    an (N,) bool mask of which are real negatives.
    """
    texts, valid = [], []
    for row, caption in enumerate(captions):
        made = rules.make(caption, None, random.Random(f"{seed}-{row}"))
        texts.append(made if made is not None and made != caption else caption)
        valid.append(made is not None and made != caption)
    return texts, np.asarray(valid, dtype=bool)


class TextFeatureBank:
    """Text tower features looked up by caption text (computed once, cached on disk)."""

    def __init__(self, encoder: TowersDualEncoder, texts: Sequence[str], cache_dir: str | Path, progress: bool = False):
        unique = list(dict.fromkeys(texts))
        self.features = torch.from_numpy(np.array(
            cached_text_tower_features(encoder, unique, cache_dir, progress=progress), dtype=np.float32))
        self.row = {text: i for i, text in enumerate(unique)}

    def __len__(self) -> int:
        return len(self.row)

    def lookup(self, texts: Sequence[str]) -> torch.Tensor:
        """(N, 384) tower features of `texts` (each must be in the bank)."""
        missing = [t for t in texts if t not in self.row]
        if missing:
            raise KeyError(f"{len(missing)} texts have no cached tower features, e.g. {missing[0]!r}")
        return self.features[[self.row[t] for t in texts]]


class BankTextEncoder:
    """The text side of a heads model on banked tower features: what `embed_texts` needs
    (`eval()`, `embed_dim`, `encode_texts` returning unit vectors)."""

    def __init__(self, encoder: TowersDualEncoder, bank: TextFeatureBank):
        self.encoder, self.bank = encoder, bank

    @property
    def embed_dim(self) -> int:
        return self.encoder.embed_dim

    def eval(self) -> BankTextEncoder:
        self.encoder.eval()
        return self

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        return self.encoder.head_text(self.bank.lookup(texts))


class RecordingTextEncoder:
    """Stands in for an encoder to learn which texts a measurement will ask for; returns
    random unit vectors (its scores are meaningless and thrown away)."""

    def __init__(self, embed_dim: int):
        self.embed_dim = embed_dim
        self.texts: list[str] = []

    def eval(self) -> RecordingTextEncoder:
        return self

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        self.texts.extend(texts)
        return torch.nn.functional.normalize(torch.randn(len(texts), self.embed_dim), dim=1)


__all__ = ["BankTextEncoder", "RecordingTextEncoder", "SplitFeatures", "TextFeatureBank", "dataset_features",
           "rule_negative_captions"]
