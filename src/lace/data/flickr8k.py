"""Flickr8k: 8,091 photographs with five captions each, and lace's fixed split of them.

Layout expected under a root folder (see docs/flickr8k.md for how to obtain it):

    <root>/captions.csv   columns `image,caption`, one row per caption
    <root>/images/        the JPEG files named in `image`

The split (the copy has no official one): take the distinct image names, sort them
as strings, permute them with `numpy.random.default_rng(SPLIT_SEED).permutation`,
and cut the permuted list into train, validation and test in the proportions
6,000 : 1,000 : 1,091. On the full 8,091 images that gives exactly 6,000 train,
1,000 validation and 1,091 test images; a smaller or larger folder is cut in the
same proportions (`round`, test takes the rest). Captions follow their image.

The data folder is always an argument: the library has no default location.
Commands may read it from the environment variable `LACE_FLICKR8K`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from lace.data.dataset import ImageTextDataset
from lace.data.readers import read_csv
from lace.errors import LaceInputError

ENV_VARIABLE = "LACE_FLICKR8K"
SPLIT_SEED = 8091
SPLIT_SIZES = {"train": 6000, "val": 1000, "test": 1091}
"""Images per split on the full dataset; other sizes are cut in these proportions."""
SPLITS = tuple(SPLIT_SIZES)


def split_image_names(image_names: list[str], seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """Deterministic train / val / test split of distinct image names.

    The result does not depend on the order of `image_names`. Each list keeps the
    permuted order.
    """
    names = sorted(set(image_names))
    if len(names) != len(image_names):
        raise LaceInputError("split_image_names: expected distinct image names")
    permuted = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    total = sum(SPLIT_SIZES.values())
    n_train = round(len(names) * SPLIT_SIZES["train"] / total)
    n_val = round(len(names) * SPLIT_SIZES["val"] / total)
    return {
        "train": permuted[:n_train],
        "val": permuted[n_train:n_train + n_val],
        "test": permuted[n_train + n_val:],
    }


def _check_root(root: Path) -> None:
    if not (root / "captions.csv").is_file() or not (root / "images").is_dir():
        raise LaceInputError(
            f"{root}: expected a Flickr8k folder with captions.csv (columns image,caption) and images/; "
            "see docs/flickr8k.md for how to obtain it"
        )


def read_flickr8k(root: str | Path, split: str | None = None, check_images: bool = True) -> ImageTextDataset:
    """Flickr8k as an `ImageTextDataset`, each record tagged with its split.

    Args:
        root: folder holding `captions.csv` and `images/`.
        split: "train", "val" or "test" to keep one split; None keeps all images in
            split order (train, then val, then test).
        check_images: raise `LaceInputError` naming the first missing image files.
    """
    if split is not None and split not in SPLITS:
        raise LaceInputError(f"Flickr8k split {split!r}: expected one of {list(SPLITS)}")
    root = Path(root)
    _check_root(root)
    dataset = read_csv(root / "captions.csv", image_root=root / "images", image_column="image", caption_column="caption")
    by_name = {record.image_id: record for record in dataset.records}
    splits = split_image_names(list(by_name))
    records = [
        dataclasses.replace(by_name[name], split=name_split)
        for name_split in SPLITS if split in (None, name_split)
        for name in splits[name_split]
    ]
    result = ImageTextDataset(records, dataset.source)
    if check_images:
        missing = result.missing_images()
        if missing:
            examples = [str(result.records[i].image_path) for i in missing[:3]]
            raise LaceInputError(f"{root}: {len(missing)} image files named in captions.csv are missing, e.g. {examples}")
    return result


def read_flickr8k_splits(root: str | Path, check_images: bool = True) -> dict[str, ImageTextDataset]:
    """All three splits, read once: {"train": ..., "val": ..., "test": ...}."""
    everything = read_flickr8k(root, check_images=check_images)
    return {
        name: ImageTextDataset([r for r in everything.records if r.split == name], everything.source)
        for name in SPLITS
    }
