"""The shapes world as in-memory training pairs: decoded once, no per-step image I/O."""

from __future__ import annotations

from pathlib import Path

from lace.data import read_dataset
from lace.data.dataset import ImageTextDataset
from lace.encoders.base import DualEncoder
from lace.encoders.preprocess import preprocess_images
from lace.train.data import TensorPairs
from lace.train.rendered import RenderedNegatives, rendered_negatives


def world_split(world_dir, split: str, style: str) -> ImageTextDataset:
    """One split of the world with captions of one style (`web` or `coco`)."""
    return read_dataset(f"{world_dir}/karpathy_{style}.json", split=split)


def world_pairs(world_dir, split: str, style: str, encoder: DualEncoder, cache: dict | None = None) -> TensorPairs:
    """(N, 3, H, W) pixels in the encoder's input format with every caption of each image.

    `cache`: the split's decoded pixels are kept there and reused by the other caption style
    (both styles caption the same images in the same order), so each image is decoded once.
    """
    dataset = world_split(world_dir, split, style)
    paths = [str(record.image_path) for record in dataset.records]
    cached_paths, pixels = (cache or {}).get(f"pixels {split}", (None, None))
    if cached_paths != paths:
        pixels = preprocess_images(encoder.preprocess, [dataset.load_image(i) for i in range(len(dataset))])
        if cache is not None:
            cache[f"pixels {split}"] = (paths, pixels)
    return TensorPairs(pixels, [record.captions for record in dataset.records])


def rendered_train_negatives(world_dir, encoder: DualEncoder, cache: dict) -> RenderedNegatives:
    """The colour-swapped rendering of every training scene, in the train pairs' order; made once per `cache`."""
    if "rendered swaps" not in cache:
        dataset = world_split(world_dir, "train", "coco")
        scene_ids = [Path(record.image_path).stem for record in dataset.records]
        cache["rendered swaps"] = rendered_negatives(world_dir, scene_ids, encoder.preprocess)
    return cache["rendered swaps"]
