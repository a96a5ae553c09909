"""One policy for image files that are missing or unreadable, met from the command line: `lace train`, `lace embed`
and `lace eval` on a user's CSV with one missing PNG and one truncated JPEG (named twice), with
`--missing-images skip|error`; and a forgotten `--image-root`."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lace.cli import main
from lace.data import read_csv
from tests.conftest import make_images

MODEL = ["--model", "lace-micro-32", "--pretrained", "none", "--device", "cpu"]


def write_broken_jpeg(path: Path) -> None:
    """A JPEG cut in half: Pillow identifies it, but decoding it fails."""
    pixels = (np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture
def user_csv(tmp_path: Path) -> Path:
    """8 image files named in data.csv: 6 good PNGs, gone.png (missing), broken.jpg (truncated, two rows)."""
    folder = tmp_path / "data"
    names = make_images(folder / "images", 6)
    write_broken_jpeg(folder / "images" / "broken.jpg")
    rows = [f"images/{name},a square number {i}" for i, name in enumerate(names)]
    rows += ["images/gone.png,a square that is not there", "images/broken.jpg,a broken square",
             "images/broken.jpg,the same broken square"]
    path = folder / "data.csv"
    path.write_text("filepath,title\n" + "\n".join(rows) + "\n")
    return path


def messages(capsys, caplog) -> str:
    captured = capsys.readouterr()
    return captured.out + captured.err + caplog.text


def assert_names_both(text: str) -> None:
    assert "gone.png" in text and "broken.jpg" in text
    assert "1 missing" in text and "1 unreadable" in text


def test_train_skips_each_bad_file_once_with_one_line_naming_them(user_csv, tmp_path, capsys, caplog):
    code = main(["train", *MODEL, "--data", str(user_csv), "--out", str(tmp_path / "run"), "--steps", "4",
                 "--batch-size", "4", "--checkpoint-every", "0", "--no-progress", "--missing-images", "skip"])
    assert code == 0
    text = messages(capsys, caplog)
    lines = [line for line in text.splitlines() if "skipped 2 of 8 image files" in line]
    assert len(lines) == 1, text  # one summary line, counting files (broken.jpg has two rows)
    assert_names_both(lines[0])
    assert "skipped 2 images" in text  # the closing line counts the same files, not each time a batch met them
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["skipped_images"] == 2


def test_train_error_policy_names_the_files_and_the_way_out(user_csv, tmp_path, capsys, caplog):
    code = main(["train", *MODEL, "--data", str(user_csv), "--out", str(tmp_path / "run"), "--steps", "2",
                 "--batch-size", "4", "--no-progress", "--missing-images", "error"])
    assert code == 2
    text = messages(capsys, caplog)
    assert_names_both(text)
    assert "2 of 8 image files" in text and "--missing-images skip" in text


def test_a_forgotten_image_root_is_named_with_an_example_path(user_csv, tmp_path, capsys, caplog):
    moved = tmp_path / "elsewhere.csv"  # the same rows, read relative to another folder
    moved.write_text(user_csv.read_text())
    for command in (["train", "--steps", "2", "--batch-size", "4"], ["embed"]):
        code = main([command[0], *MODEL, "--data", str(moved), "--out", str(tmp_path / command[0]), *command[1:],
                     "--no-progress", "--missing-images", "skip"])
        assert code == 2, command
        text = messages(capsys, caplog)
        assert "none of the 8 image files exist" in text and "--image-root" in text, text
        assert str(tmp_path / "images" / "img_000.png") in text


def test_embed_skips_or_stops_on_the_same_input(user_csv, tmp_path, capsys, caplog):
    code = main(["embed", *MODEL, "--data", str(user_csv), "--out", str(tmp_path / "store"), "--no-progress",
                 "--missing-images", "skip"])
    assert code == 0
    text = messages(capsys, caplog)
    assert_names_both(text)
    index = json.loads((tmp_path / "store" / "index.json").read_text())
    assert len(index["image_paths"]) == 6 and not any("broken" in p or "gone" in p for p in index["image_paths"])
    assert main(["embed", *MODEL, "--data", str(user_csv), "--out", str(tmp_path / "store2"), "--no-progress"]) == 2
    text = messages(capsys, caplog)
    assert_names_both(text)
    assert not (tmp_path / "store2").exists()


def test_eval_on_a_users_csv_points_at_the_files_not_at_coco(user_csv, tmp_path, capsys, caplog):
    out = tmp_path / "r.json"
    args = ["eval", *MODEL, "--benchmarks", "retrieval", "--data", str(user_csv), "--no-diagnostics",
            "--no-progress", "--out", str(out)]
    assert main(args) == 2
    text = messages(capsys, caplog)
    assert_names_both(text)
    assert "karpathy" not in text.lower() and "cocodataset" not in text.lower()
    torch.manual_seed(0)
    assert main([*args, "--skip-missing"]) == 0
    results = json.loads(out.read_text())
    assert results["items"]["retrieval"] == {"data.csv": {"scored": 6, "skipped": 2}}
    assert set(results["benchmarks"]["retrieval"]) == {f"{d}/R@{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)}
    text = messages(capsys, caplog)
    assert "skipped 2 of 8 image files" in text and "6 scored, 2 skipped" in text


def test_the_dataset_policy_keeps_every_readable_record(user_csv):
    from lace.data.images import apply_image_policy

    dataset = read_csv(user_csv)
    kept, check = apply_image_policy(dataset, "skip")
    assert [record.image_path.name for record in kept.records] == [f"img_{i:03d}.png" for i in range(6)]
    assert check.n_files == 8 and sorted(Path(p).name for p in check.bad) == ["broken.jpg", "gone.png"]
    assert "truncated" in check.unreadable[str(user_csv.parent / "images" / "broken.jpg")].lower()
