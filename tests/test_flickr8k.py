"""Flickr8k reader and its fixed split, on folders made in the test."""

from __future__ import annotations

import csv
import random

import pytest
from PIL import Image

from lace.data.flickr8k import SPLIT_SIZES, read_flickr8k, read_flickr8k_splits, split_image_names
from lace.errors import LaceInputError


def make_flickr8k(root, n_images: int, captions_per_image: int = 5, with_files: bool = True):
    (root / "images").mkdir(parents=True)
    rows = []
    for i in range(n_images):
        name = f"{1000 + i * 7919}_{i:04x}.jpg"
        if with_files:
            Image.new("RGB", (32, 24), (i * 9 % 256, 80, 160)).save(root / "images" / name)
        rows += [(name, f"photo {i} caption {j} .") for j in range(captions_per_image)]
    random.Random(0).shuffle(rows)  # row order must not matter
    with open(root / "captions.csv", "w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), *rows])
    return root


def test_full_size_split_has_the_documented_counts():
    names = [f"{i:06d}.jpg" for i in range(8091)]
    splits = split_image_names(names)
    assert {k: len(v) for k, v in splits.items()} == SPLIT_SIZES == {"train": 6000, "val": 1000, "test": 1091}
    assert set().union(*map(set, splits.values())) == set(names)


def test_split_is_deterministic_order_free_and_proportional():
    names = [f"img_{i:03d}.jpg" for i in range(200)]
    splits = split_image_names(names)
    shuffled = list(reversed(names))
    assert split_image_names(shuffled) == splits
    sizes = {k: len(v) for k, v in splits.items()}
    assert sizes == {"train": round(200 * 6000 / 8091), "val": round(200 * 1000 / 8091), "test": 200 - 148 - 25}
    assert sum(sizes.values()) == 200 and not set(splits["train"]) & set(splits["test"])
    assert splits["train"] != sorted(splits["train"])  # permuted, not alphabetical blocks
    assert split_image_names(names, seed=1) != splits
    with pytest.raises(LaceInputError, match="distinct"):
        split_image_names(["a.jpg", "a.jpg"])


def test_reader_groups_captions_and_tags_splits(tmp_path):
    root = make_flickr8k(tmp_path / "flickr8k", n_images=40)
    splits = read_flickr8k_splits(root)
    assert {k: len(v) for k, v in splits.items()} == {"train": 30, "val": 5, "test": 5}
    test = read_flickr8k(root, split="test")
    assert [r.image_id for r in test.records] == [r.image_id for r in splits["test"].records]
    record = test.records[0]
    assert record.split == "test" and len(record.captions) == 5
    assert record.image_path == root / "images" / record.image_id
    index = int(record.image_id.split("_")[1].removesuffix(".jpg"), 16)
    assert set(record.captions) == {f"photo {index} caption {j} ." for j in range(5)}
    assert test.load_image(0).size == (32, 24)
    everything = read_flickr8k(root)
    assert [r.split for r in everything.records] == ["train"] * 30 + ["val"] * 5 + ["test"] * 5


def test_reader_names_what_is_wrong(tmp_path):
    with pytest.raises(LaceInputError, match="captions.csv"):
        read_flickr8k(tmp_path)
    root = make_flickr8k(tmp_path / "flickr8k", n_images=8)
    with pytest.raises(LaceInputError, match="split 'dev'"):
        read_flickr8k(root, split="dev")
    (root / "images" / min(p.name for p in (root / "images").iterdir())).unlink()
    with pytest.raises(LaceInputError, match="1 image files named in captions.csv are missing"):
        read_flickr8k(root)
    assert len(read_flickr8k(root, check_images=False)) == 8
