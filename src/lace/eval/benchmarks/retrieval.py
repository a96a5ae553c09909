"""Image-text retrieval: recall@1/5/10 both ways on COCO or Flickr30k Karpathy test, or any
dataset `lace.data.read_dataset` reads; several captions per image count as several positives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lace.data import read_dataset
from lace.data.dataset import ImageTextDataset
from lace.errors import LaceInputError
from lace.eval.benchmarks.base import Benchmark, register_benchmark
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import retrieval_recall


@dataclass
class RetrievalData:
    dataset: ImageTextDataset
    recall_ks: tuple[int, ...] = (1, 5, 10)


def dataset_embeddings(cache: EmbeddingCache, dataset: ImageTextDataset) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_img, d) image and (N_txt, d) caption embeddings of a dataset, through the cache."""
    images = cache.images([(str(record.image_path), None) for record in dataset.records])
    return images, cache.texts(dataset.captions)


@register_benchmark("retrieval")
class Retrieval(Benchmark):
    published_at = None  # the user's own data, or COCO/Flickr30k read as such: no download page to point at
    image_folder_flag = "--image-root"

    def load(self, root: str | Path, split: str | None = "test", image_root: str | Path | None = None,
             recall_ks: tuple[int, ...] = (1, 5, 10)) -> RetrievalData:
        root = Path(root)
        if not root.exists() and "{" not in str(root):
            raise self.missing(root, "dataset file")
        dataset = read_dataset(root, split=split, image_root=image_root)
        if any(record.tar_member is not None for record in dataset.records):
            raise LaceInputError(f"{root}: retrieval evaluation reads image files; extract webdataset shards first")
        if not len(dataset):
            raise LaceInputError(f"{root}: no images to evaluate (split {split!r})")
        dataset = self.usable(root.name, dataset, [[str(record.image_path)] for record in dataset.records])
        return RetrievalData(dataset, tuple(recall_ks))

    def score(self, cache: EmbeddingCache, data: RetrievalData) -> dict[str, float]:
        images, texts = dataset_embeddings(cache, data.dataset)
        return retrieval_recall(images, texts, data.dataset.caption_image_index, data.recall_ks)
