import io
import json
import tarfile

import pytest

from lace.data import read_coco_captions, read_csv, read_dataset, read_karpathy, read_webdataset
from lace.errors import LaceInputError
from tests.conftest import make_images


def test_coco_captions_groups_captions_and_resolves_images(tiny_coco):
    dataset = read_dataset(tiny_coco)
    assert len(dataset) == 6
    assert all(len(r.captions) == 2 for r in dataset.records)
    assert all(r.image_path.is_file() for r in dataset.records)
    assert dataset.caption_image_index == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert dataset.load_image(0).size == (32, 32)


def test_coco_missing_field_names_file_and_field(tmp_path):
    path = tmp_path / "captions.json"
    path.write_text(json.dumps({"images": [{"id": 1}], "annotations": []}))
    with pytest.raises(LaceInputError, match=r"captions.json.*file_name"):
        read_coco_captions(path)
    path.write_text(json.dumps({"images": [], "annotations": [{"image_id": 1}]}))
    with pytest.raises(LaceInputError, match=r"caption"):
        read_coco_captions(path)


def test_coco_empty_caption_is_refused(tmp_path):
    path = tmp_path / "captions.json"
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}],
                                "annotations": [{"image_id": 1, "caption": "   "}]}))
    with pytest.raises(LaceInputError, match="non-empty caption"):
        read_coco_captions(path)


def test_karpathy_split_selection_and_restval(tmp_path):
    make_images(tmp_path / "val2014", 3)
    images = [
        {"filepath": "val2014", "filename": f"img_{i:03d}.png", "split": split, "imgid": i, "cocoid": 100 + i,
         "sentences": [{"raw": f"caption {i} {j}", "tokens": []} for j in range(5)]}
        for i, split in enumerate(["train", "restval", "test"])
    ]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    train = read_karpathy(path, split="train")
    assert [r.image_id for r in train.records] == ["100", "101"]
    test = read_dataset(path, split="test")
    assert len(test) == 1 and len(test.records[0].captions) == 5
    assert test.records[0].image_path.is_file()
    with pytest.raises(LaceInputError, match="split 'val'"):
        read_karpathy(path, split="val")


def test_karpathy_missing_sentences(tmp_path):
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"images": [{"filename": "x.png", "split": "test"}]}))
    with pytest.raises(LaceInputError, match="sentences"):
        read_karpathy(path)


@pytest.mark.parametrize("separator,suffix,image_col,caption_col", [
    (",", ".csv", "image", "caption"), ("\t", ".tsv", "filepath", "title"),
])
def test_csv_and_tsv(tmp_path, separator, suffix, image_col, caption_col):
    names = make_images(tmp_path / "images", 2)
    lines = [f"{image_col}{separator}{caption_col}"] + [
        f"images/{n}{separator}a caption {j}" for n in names for j in range(3)
    ]
    path = tmp_path / f"pairs{suffix}"
    path.write_text("\n".join(lines) + "\n")
    dataset = read_dataset(path)
    assert len(dataset) == 2 and len(dataset.captions) == 6
    assert dataset.load_image(1).size == (32, 32)


def test_csv_bad_header_and_missing_image(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("picture,words\na.png,hello\n")
    with pytest.raises(LaceInputError, match="image column"):
        read_csv(path)
    path.write_text("image,caption\nmissing.png,hello\n")
    dataset = read_csv(path)
    assert dataset.missing_images() == [0]
    with pytest.raises(LaceInputError, match="missing.png.*not found"):
        dataset.load_image(0)


def test_unreadable_image_names_the_file(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    path = tmp_path / "pairs.csv"
    path.write_text("image,caption\nbroken.png,hello\n")
    with pytest.raises(LaceInputError, match="broken.png.*unreadable"):
        read_csv(path).load_image(0)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_webdataset_shards_with_brace_pattern(tmp_path):
    names = make_images(tmp_path / "src", 4)
    for shard in range(2):
        with tarfile.open(tmp_path / f"shard-{shard:03d}.tar", "w") as tar:
            for i in range(2):
                key = f"{shard}{i:04d}"
                _add(tar, f"{key}.png", (tmp_path / "src" / names[2 * shard + i]).read_bytes())
                if i == 0:
                    _add(tar, f"{key}.txt", b"first caption\nsecond caption\n")
                else:
                    _add(tar, f"{key}.json", json.dumps({"caption": "from json"}).encode())
    dataset = read_webdataset(str(tmp_path / "shard-{000..001}.tar"))
    assert len(dataset) == 4
    assert dataset.records[0].captions == ("first caption", "second caption")
    assert dataset.records[1].captions == ("from json",)
    assert dataset.load_image(3).size == (32, 32)


def test_webdataset_missing_caption(tmp_path):
    names = make_images(tmp_path / "src", 1)
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        _add(tar, "k.png", (tmp_path / "src" / names[0]).read_bytes())
    with pytest.raises(LaceInputError, match="caption member"):
        read_dataset(tmp_path / "s.tar")


def test_unknown_format(tmp_path):
    with pytest.raises(LaceInputError, match="unknown dataset format"):
        read_dataset(tmp_path / "data.parquet")


def test_a_dataset_file_rewritten_with_the_same_size_is_parsed_again(tmp_path):
    """Dataset JSON is parsed once per content (`_read_dataset_json`): an edit that keeps the size, written in
    the same clock tick, must still be read, and an unchanged file must give the same records."""
    make_images(tmp_path / "images", 1)
    path = tmp_path / "k.json"

    def write(caption: str) -> None:
        path.write_text(json.dumps({"images": [{"filepath": "images", "filename": "img_000.png", "split": "test",
                                                "sentences": [{"raw": caption}]}]}))

    write("a red cube")
    first = read_dataset(path, split="test")
    assert read_dataset(path, split="test").records == first.records
    write("a tan cube")  # same length
    assert read_dataset(path, split="test").records[0].captions == ("a tan cube",)
