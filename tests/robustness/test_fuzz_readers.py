"""Fuzzing the dataset readers (`lace.data.readers`, `lace.data.flickr8k`).

COCO captions and Karpathy JSON files are dumps of format-shaped values (each field kept, dropped or
replaced by any JSON value, NaN included), CSV/TSV files are any header and rows, webdataset shards
are tars of any members, Flickr8k folders hold any captions.csv. A reader either returns records
with an image path, a string id and non-empty string captions, or raises `LaceInputError` naming
the file it refuses.
"""

from __future__ import annotations

import csv
import io
import json
import tarfile
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from lace.data.dataset import ImageTextDataset
from lace.data.flickr8k import read_flickr8k
from lace.data.readers import (
    read_coco_captions,
    read_csv,
    read_dataset,
    read_karpathy,
    read_webdataset,
)
from tests.robustness.fuzz_support import JSON_VALUES, expect_input_error, fuzz, near

COCO = {"images": [{"id": 1, "file_name": "a.png"}, {"id": "2", "file_name": "b.png"}],
        "annotations": [{"image_id": 1, "caption": "a red cube"}, {"image_id": "2", "caption": "two dogs"}]}
KARPATHY = {"images": [{"filename": "a.png", "filepath": "val2014", "split": "test", "cocoid": 7,
                        "sentences": [{"raw": "a red cube"}, {"raw": "a cube"}]},
                       {"filename": "b.png", "split": "restval", "sentences": [{"raw": "two dogs"}]}]}
COLUMNS = ["filepath", "title", "image", "caption", "text", "x"]
CELLS = st.text(max_size=8) | st.sampled_from(["a.png", "b.png", "a red cube", ""])


def check_dataset(dataset: ImageTextDataset | None) -> None:
    if dataset is None:
        return
    for record in dataset.records:
        assert isinstance(record.image_id, str) and isinstance(record.image_path, Path)
        assert record.captions and all(isinstance(c, str) and c.strip() == c and c for c in record.captions)
    assert len(dataset.captions) == len(dataset.caption_image_index)


def write_json(folder: Path, name: str, value) -> Path:
    path = folder / name
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


@fuzz(120)
@given(near(COCO))
@example({"images": [{"id": [1], "file_name": "a.png"}], "annotations": [{"image_id": [1], "caption": "x"}]})
def test_coco_captions(value):
    with tempfile.TemporaryDirectory() as folder:
        path = write_json(Path(folder), "captions.json", value)
        check_dataset(expect_input_error(lambda: read_coco_captions(path), path))
        check_dataset(expect_input_error(lambda: read_dataset(path), path))


@fuzz(120)
@given(near(KARPATHY), st.sampled_from([None, "test", "train"]))
@example({"images": [{"filename": "a.png", "filepath": 3, "split": "test", "sentences": [{"raw": "x"}]}]}, None)
def test_karpathy(value, split):
    with tempfile.TemporaryDirectory() as folder:
        path = write_json(Path(folder), "dataset_coco.json", value)
        check_dataset(expect_input_error(lambda: read_karpathy(path, split=split), path))
        check_dataset(expect_input_error(lambda: read_dataset(path, split=split), path))


@fuzz(50)
@given(JSON_VALUES | st.binary(max_size=30))
@example(b"\xff\xfe")
@example(b"[" * 5000)
def test_any_json_file(value):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.json"
        path.write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())
        check_dataset(expect_input_error(lambda: read_dataset(path), path))


CSV_TABLES = st.tuples(st.lists(st.sampled_from(COLUMNS) | st.text(max_size=5), max_size=4),
                       st.lists(st.lists(CELLS, max_size=5), max_size=4))


@fuzz(120)
@given(CSV_TABLES | st.binary(max_size=40) | st.text(max_size=60), st.sampled_from([".csv", ".tsv"]))
@example(b"image,caption\n\xff.png,a cube\n", ".csv")
@example('image,caption\na.png,"' + "x" * 140000 + '"\n', ".csv")
@example("image,caption\na.png,a\x00cube\n", ".csv")
def test_csv(table, suffix):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"pairs{suffix}"
        if isinstance(table, tuple):
            text = io.StringIO()
            writer = csv.writer(text, delimiter="\t" if suffix == ".tsv" else ",")
            writer.writerow(table[0])
            writer.writerows(table[1])
            path.write_text(text.getvalue(), encoding="utf-8")
        else:
            path.write_bytes(table if isinstance(table, bytes) else table.encode("utf-8"))
        check_dataset(expect_input_error(lambda: read_csv(path), path))
        check_dataset(expect_input_error(lambda: read_dataset(path), path))


MEMBER_NAMES = st.sampled_from(["k1", "k2", "dir/k3"]).flatmap(
    lambda key: st.sampled_from([".png", ".JPG", ".txt", ".json", ".cls", ".a.txt", ""]).map(lambda ext: key + ext))
MEMBER_BYTES = (st.binary(max_size=20) | st.text(max_size=20).map(str.encode)
                | JSON_VALUES.map(lambda v: json.dumps(v).encode())
                | near({"caption": "a cube", "captions": ["a", "b"]}).map(lambda v: json.dumps(v).encode()))


@fuzz(100)
@given(st.lists(st.tuples(MEMBER_NAMES, MEMBER_BYTES), max_size=5) | st.binary(max_size=64))
@example([("k1.png", b""), ("k1.json", b'{"captions": 3}')])
@example([("k1.png", b""), ("k1.txt", b"\xff")])
@example([("k1.png", b""), ("k1.json", b"{")])
def test_webdataset_shards(members):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "shard-000000.tar"
        if isinstance(members, bytes):
            path.write_bytes(members)
        else:
            with tarfile.open(path, "w") as tar:
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        dataset = expect_input_error(lambda: read_webdataset(path), path)
        check_dataset(dataset)
        if dataset is not None:
            assert all(record.tar_member for record in dataset.records)


@fuzz(60)
@given(st.lists(st.lists(CELLS, min_size=0, max_size=3), max_size=6), st.booleans(),
       st.sampled_from([None, "train", "val", "test"]))
def test_flickr8k(rows, check_images, split):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "images").mkdir()
        (root / "images" / "a.png").write_bytes(b"")
        text = io.StringIO()
        csv.writer(text).writerows([["image", "caption"], *rows])
        (root / "captions.csv").write_text(text.getvalue(), encoding="utf-8")
        dataset = expect_input_error(lambda: read_flickr8k(root, split=split, check_images=check_images), root)
        check_dataset(dataset)
        if dataset is not None:
            assert all(record.split == split for record in dataset.records) or split is None
