"""`lace eval --skip-missing`: SugarCrepe (in its release layout) and Winoground scored on the items whose images
exist, items scored and skipped per file in the JSON and on the console with every file and the mean; and
`lace compare --png` charting scores only."""

import json
from pathlib import Path

import pytest
import torch

from lace.cli import main
from lace.report import plots
from tests.conftest import make_images

MODEL = ["--model", "lace-micro-32", "--pretrained", "none", "--device", "cpu"]
FILES = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")


def write_sugarcrepe(root: Path, with_missing: bool) -> None:
    """Seven files of id -> {filename, caption, negative_caption}, two items each on images that exist; add_att
    and swap_obj also hold an item on 000000000404.jpg, which is not in val2017, when `with_missing`."""
    names = make_images(root / "val2017", 2)
    for name in FILES:
        items = {"0": {"filename": names[0], "caption": "a red square on a table",
                       "negative_caption": "a red table on a square"},
                 "1": {"filename": names[1], "caption": "a green square near a dog",
                       "negative_caption": "a green dog near a square" if name.startswith("swap") else "a cat"}}
        if with_missing and name in ("add_att", "swap_obj"):
            items["2"] = {"filename": "000000000404.jpg", "caption": "a cat", "negative_caption": "a dog"}
        (root / f"{name}.json").write_text(json.dumps(items))


def run_eval(out: Path, *extra: str) -> int:
    torch.manual_seed(0)
    return main(["eval", *MODEL, "--no-diagnostics", "--no-progress", "--out", str(out), *extra])


def test_sugarcrepe_scores_the_items_whose_images_exist_and_counts_them_per_file(tmp_path, capsys):
    root, complete = tmp_path / "sugarcrepe", tmp_path / "complete"
    write_sugarcrepe(root, with_missing=True)
    write_sugarcrepe(complete, with_missing=False)
    args = ["--benchmarks", "sugarcrepe", "--sugarcrepe-root"]
    assert run_eval(tmp_path / "r.json", *args, str(root)) == 2
    error = capsys.readouterr().err
    assert "000000000404.jpg" in error and "--missing-images skip" in error
    assert not (tmp_path / "r.json").exists()

    assert run_eval(tmp_path / "r.json", *args, str(root), "--skip-missing") == 0
    shown = capsys.readouterr()
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["items"]["sugarcrepe"] == {
        name: {"scored": 2, "skipped": int(name in ("add_att", "swap_obj"))} for name in FILES}
    figures = results["benchmarks"]["sugarcrepe"]
    assert figures["mean"] == pytest.approx(sum(figures[name] for name in FILES) / 7)
    # the same figures as on a release holding only the items whose images exist
    assert run_eval(tmp_path / "complete.json", *args, str(complete)) == 0
    assert json.loads((tmp_path / "complete.json").read_text())["benchmarks"]["sugarcrepe"] == figures

    out = shown.out
    assert all(f"{name} {figures[name]:.3f}" in out for name in FILES), out
    assert f"mean {figures['mean']:.3f}" in out
    assert "sugarcrepe items: add_att 2 (1 skipped), add_obj 2," in out and "14 scored, 2 skipped in all" in out
    assert "same_words_share" not in out  # a property of the data, left to the JSON
    assert "skipped 1 of 3 image files" in shown.err and "scored 14 items, skipped 2" in shown.err


def test_winoground_skips_an_example_with_a_missing_image(tmp_path, capsys):
    root = tmp_path / "winoground"
    names = make_images(root / "images", 4)
    stems = [Path(name).stem for name in names]
    examples = [{"id": 0, "image_0": stems[0], "image_1": stems[1], "caption_0": "a red cube", "caption_1": "a cube red"},
                {"id": 1, "image_0": stems[2], "image_1": "gone", "caption_0": "a dog", "caption_1": "a god"},
                {"id": 2, "image_0": stems[2], "image_1": stems[3], "caption_0": "a cat", "caption_1": "a act"}]
    (root / "examples.jsonl").write_text("\n".join(json.dumps(example) for example in examples) + "\n")
    args = ["--benchmarks", "winoground", "--winoground-root", str(root)]
    assert run_eval(tmp_path / "r.json", *args) == 2
    assert "gone.png" in capsys.readouterr().err
    assert run_eval(tmp_path / "r.json", *args, "--missing-images", "skip") == 0
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["items"]["winoground"] == {"examples": {"scored": 2, "skipped": 1}}
    assert set(results["benchmarks"]["winoground"]) >= {"text", "image", "group"}


def test_compare_charts_scores_and_leaves_out_properties_of_the_data(tmp_path, monkeypatch):
    figures = {"swap_att": 0.5, "swap_att/same_words": 0.25, "swap_att/same_words_share": 0.4, "mean": 0.6}
    for name, shift in (("a", 0.0), ("b", 0.1)):
        scores = {key: value + shift for key, value in figures.items()}
        (tmp_path / f"{name}.json").write_text(json.dumps({"model": "m", "benchmarks": {"sugarcrepe": scores}}))
    charted = []
    original = plots.grouped_bars
    monkeypatch.setattr(plots, "grouped_bars", lambda values, *a, **k: charted.extend(values) or original(values, *a, **k))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--png", str(tmp_path / "c.png")]) == 0
    assert charted == ["sugarcrepe/swap_att", "sugarcrepe/swap_att/same_words", "sugarcrepe/mean"]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_zeroshot_leaves_out_an_image_that_does_not_decode(tmp_path, capsys):
    root = tmp_path / "pets"
    for label in ("cat", "dog"):
        make_images(root / label, 2)
    (root / "dog" / "img_002.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")  # named like an image, not one
    args = ["--benchmarks", "zeroshot", "--zeroshot-root", str(root)]
    assert run_eval(tmp_path / "r.json", *args) == 2
    assert "img_002.png" in capsys.readouterr().err
    assert run_eval(tmp_path / "r.json", *args, "--skip-missing") == 0
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["items"]["zeroshot"] == {"pets": {"scored": 4, "skipped": 1}}
    assert "1 unreadable" in capsys.readouterr().err
