"""Shared fixtures: tiny image-text data made on the fly, nothing downloaded."""

from __future__ import annotations

import json
import os
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with the most `slow` tests first, each file's tests in their own order. `make test` hands whole
    files to its two workers in this order, so the long files start at once and the short ones fill in."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    first_seen = {path: rank for rank, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first_seen[item.path]))


@pytest.fixture(scope="session", autouse=True)
def _no_fsync_in_this_process():
    """`os.fsync` does nothing in the test process (and the stage workers it forks).

    `lace.io.atomic_path` flushes every file to the disk before its rename, which guards against a power cut, not a
    killed process; no test can see the flush, and on a shared disk each one waits about 10 ms (half a thousand per
    demo run). What the tests check stays as it was: the temporary file, its rename, and the `os.fsync` call itself
    (a test that makes the flush fail patches it over this one). Subprocesses (`lace train`, torchrun) keep it.
    """
    patch = pytest.MonkeyPatch()
    patch.setattr(os, "fsync", lambda fd: None)
    yield
    patch.undo()


COLOURS = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 30, 220), "yellow": (230, 220, 40)}


def make_images(folder: Path, n: int, size: int = 32) -> list[str]:
    """Write n small solid-colour PNGs; return their file names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        colour = list(COLOURS.values())[i % len(COLOURS)]
        image = Image.new("RGB", (size, size), colour)
        name = f"img_{i:03d}.png"
        image.save(folder / name)
        names.append(name)
    return names


@pytest.fixture
def tiny_coco(tmp_path: Path) -> Path:
    """A COCO captions JSON in annotations/ with images in images/ (COCO's own layout)."""
    names = make_images(tmp_path / "images", 6)
    colour_names = list(COLOURS)
    data = {
        "images": [{"id": i, "file_name": f"images/{n}", "width": 32, "height": 32} for i, n in enumerate(names)],
        "annotations": [
            {"id": 10 * i + j, "image_id": i, "caption": f"a {colour_names[i % 4]} square number {j}"}
            for i in range(len(names)) for j in range(2)
        ],
    }
    (tmp_path / "annotations").mkdir()
    path = tmp_path / "annotations" / "captions_train.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def tiny_world(folder: Path, n_images: int, split_fractions: tuple[float, ...], **options) -> Path:
    """A shapes world of `n_images` 32-pixel scenes written to `folder` (replaced if there); `options`:
    other `WorldConfig` fields."""
    from lace.data.world import WorldConfig, generate_world

    generate_world(WorldConfig(n_images=n_images, image_size=32, split_fractions=split_fractions, **options), folder,
                   overwrite=True, progress=False)
    return folder


def randomise_batch_norms(model: torch.nn.Module) -> None:
    """Seeded random BatchNorm statistics and affines, so that no BatchNorm is the identity (and folding
    BatchNorm into the convolutions is exercised)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(module.num_features, generator=generator) * 0.1)


@pytest.fixture(scope="session")
def shapes_world(tmp_path_factory) -> Path:
    """A shapes world of 48 scenes (train, val, test and test_comp at 0.7, 0.1, 0.1, 0.1), made once per test
    process and shared by the files that train on it; tests read it and write nothing into it (checked at the end)."""
    world = tiny_world(tmp_path_factory.mktemp("shapes") / "world", 48, (0.7, 0.1, 0.1, 0.1))
    made = _files(world)
    yield world
    assert _files(world) == made, "a test wrote into the shared shapes world"


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, modification time in ns) of every file under `folder`."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="session")
def resnet():
    """A random tiny ResNet CLIP in eval mode whose residual branches are switched on (shared by the local-edit
    tests; a test that trains it or changes its weights works on a copy).

    open_clip starts each branch's last BatchNorm at zero, which leaves only position-wise maps and average
    pools above the stem: such a tower cannot tell two positions apart, and a swap would not change its output
    at all. Its BatchNorm affines are drawn at random instead.
    """
    from lace.encoders.open_clip_encoder import load_open_clip

    torch.manual_seed(0)
    encoder = load_open_clip("lace-micro-rn-32").eval()
    with torch.no_grad():
        for module in encoder.model.visual.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.normal_(1.0, 0.2)
    made = {key: value.clone() for key, value in encoder.model.state_dict().items()}
    yield encoder
    # shared: no test may have trained it, moved its BatchNorm statistics or left it in training mode
    assert not encoder.model.training
    assert all(torch.equal(value, made[key]) for key, value in encoder.model.state_dict().items())


@pytest.fixture(scope="module")
def top():
    """A tiny random `TowersTop` (embedding 8, heads 16 wide) for the tower-top tests."""
    from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
    from lace.encoders.towers.top import TowersTop

    torch.manual_seed(0)
    return TowersTop(TowersDualEncoder(TowersConfig(embed_dim=8, head_hidden_dim=16, head_dropout=0.1))).eval()


@pytest.fixture(scope="module")
def map_editor():
    """A map editor of four colours fitted on hand-built maps of the cut's shape (192, 7, 7)."""
    from tests.test_local_maps import fit_coloured_editor
    from tests.towers_support import CUT_CHANNELS, CUT_GRID

    return fit_coloured_editor(channels=CUT_CHANNELS, grid=CUT_GRID, n_images=120)


@pytest.fixture
def wise_ft_at_two_alphas(monkeypatch):
    """The demo's WiSE-FT stage mixes at alphas 0 and 1 only (its stage key says so), for a demo test that checks
    another stage than the trade-off curve: each alpha is one more model scored. test_demo's report test checks the
    default five on the demo it shares."""
    from lace.demo import pipeline
    from lace.experiment.wise_ft import wise_ft_stage

    alphas = (0.0, 1.0)
    monkeypatch.setattr(pipeline, "WISE_FT_ALPHAS", alphas)
    monkeypatch.setattr(pipeline, "wise_ft_stage", partial(wise_ft_stage, alphas=alphas))
