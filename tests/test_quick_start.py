"""The README's quick start on a user's own data, run as a user types it: embed a CSV, fit the dictionary, train
LACE on the CSV with open_clip_train's flag names, evaluate the run folder on the SugarCrepe images at hand.

Only the model and the sizes change (no weights can be fetched here): ViT-B-32/openai becomes a random-init
lace-micro-32, and the dictionary and batch shrink to fit a 24-row CSV."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from lace.cli import main
from tests.conftest import make_images

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "--model ViT-B-32 --pretrained openai": "--model lace-micro-32 --pretrained none",
    "--model ViT-B-32 --pretrained runs/lace": "--model lace-micro-32 --pretrained runs/lace",
    "--atoms 4096 --sparsity 8": "--atoms 16 --sparsity 4",
    "--epochs 2": "--epochs 2 --batch-size 8",
}
CAPTIONS = ("a red car on the grass", "a black dog near a white cat", "a man riding a red bicycle",
            "a white cat on a black car", "a woman with a dog on the grass", "a black car near a man")
SUGARCREPE = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")


def quick_start_commands() -> list[list[str]]:
    """The `lace` commands of the README's quick start on a user's own data, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):]
    section = section[:section.index("\n## ", 1)]
    block = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)[1]
    block = re.sub(r" *\\\n *", " ", block)
    for typed, tiny in TINY.items():
        assert typed in block, f"the quick start no longer says {typed!r}: update TINY"
        block = block.replace(typed, tiny)
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("lace ")]


def write_user_data(folder: Path) -> None:
    """my.csv (open_clip_train's filepath/title columns) over 24 images, and a SugarCrepe release whose swap_obj
    names one COCO image the user does not have."""
    names = make_images(folder / "images", 24)
    rows = [f"images/{name},{CAPTIONS[i % len(CAPTIONS)]}" for i, name in enumerate(names)]
    (folder / "my.csv").write_text("filepath,title\n" + "\n".join(rows) + "\n")
    coco = make_images(folder / "coco" / "val2017", 2)
    data = folder / "sugar-crepe" / "data"
    data.mkdir(parents=True)
    for name in SUGARCREPE:
        items = {"0": {"filename": coco[0], "caption": "a red car on the grass",
                       "negative_caption": "a red grass on the car"},
                 "1": {"filename": coco[1], "caption": "a black dog near a white cat",
                       "negative_caption": "a white dog near a black cat"}}
        if name == "swap_obj":
            items["2"] = {"filename": "000000000139.jpg", "caption": "a man", "negative_caption": "a woman"}
        (data / f"{name}.json").write_text(json.dumps(items))


@pytest.mark.slow
def test_the_readme_quick_start_runs_on_a_users_own_data(tmp_path, monkeypatch, capsys):
    write_user_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    commands = quick_start_commands()
    assert [command[0] for command in commands] == ["embed", "dict", "train", "eval"]
    torch.manual_seed(0)
    for command in commands:
        assert main([*command, "--no-progress"]) == 0, (command, capsys.readouterr().err)
    config = json.loads((tmp_path / "runs" / "lace" / "config.json").read_text())
    assert config["data"] == "my.csv" and config["counterfactual_images"] and config["caption_negatives"]
    run = tmp_path / "runs" / "lace"
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert (last["step"], last["epoch"]) == (6, 2.0)  # two passes over 24 rows at batch 8, as open_clip_train counts
    results = json.loads((tmp_path / "lace.json").read_text())
    assert results["items"]["sugarcrepe"]["swap_obj"] == {"scored": 2, "skipped": 1}
    assert set(results["benchmarks"]["sugarcrepe"]) >= {*SUGARCREPE, "mean"}
