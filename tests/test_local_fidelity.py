"""`measure_fidelity` (`python -m lace.local`) end to end on a tiny world, and its refusal of a damaged one."""

from __future__ import annotations

import json

import pytest
import torch

from lace.data.world import WorldConfig, generate_world
from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.local.fidelity import FidelityConfig, fidelity_markdown, measure_fidelity


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fidelity") / "world"
    generate_world(WorldConfig(n_images=120, image_size=32, split_fractions=(0.6, 0.2, 0.1, 0.1)), folder,
                   overwrite=True, progress=False)
    return folder


def test_fidelity_reports_each_layer_with_its_random_control(world):
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-rn-32").eval()
    config = FidelityConfig(world=str(world), layers=("layer1",), methods=("recolour_regression",),
                            text_layers=("block0",), n_items=10, n_train=60, renderer_masks=True)
    results = measure_fidelity(encoder, config, log=lambda *_: None)
    json.dumps(results)  # written as fidelity.json
    for placement in ("recolour_regression", "recolour_regression (renderer masks)"):
        for kind in ("swap", "transplant"):
            measured = results["image"]["layer1"]["methods"][placement][kind]
            assert measured["n"] == 10 and 0 < measured["valid_share"] <= 1
            for arm in ("edit", "random_control"):
                assert -1 <= measured[arm]["direction_agreement"] <= 1
                assert 0 <= measured[arm]["prefers_edited_caption"] <= 1
    caption_swap = results["text"]["block0"]
    assert 0 < caption_swap["valid_share"] <= 1 and -1 <= caption_swap["direction_agreement"] <= 1
    text = fidelity_markdown(results)
    assert "| layer1 |" in text and "recolour_regression" in text and "| block0 |" in text


def test_a_damaged_world_json_names_the_file(world, tmp_path):
    damaged = tmp_path / "world"
    damaged.mkdir()
    for path in world.iterdir():
        (damaged / path.name).symlink_to(path)
    (damaged / "world.json").unlink()
    (damaged / "world.json").write_text("{not json")
    encoder = load_encoder("lace-micro-rn-32").eval()
    with pytest.raises(LaceInputError, match="world.json"):
        measure_fidelity(encoder, FidelityConfig(world=str(damaged), layers=("layer1",), n_items=4, n_train=8),
                         log=lambda *_: None)
