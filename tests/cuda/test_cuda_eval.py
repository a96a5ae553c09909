"""`lace eval` on each device: retrieval and the world's compositional benchmark give the CPU's figures."""

from __future__ import annotations

import json

import pytest
import torch

from lace.cli import main
from lace.data.world import WorldConfig, generate_world
from tests.cuda.devices import DEVICES, exact_fp32


@pytest.fixture(scope="module")
def benchmark_world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval_world")
    config = WorldConfig(n_images=40, image_size=32, split_fractions=(0.5, 0.1, 0.3, 0.1),
                         benchmark_items_per_family=2, coco_captions=2)
    generate_world(config, folder, overwrite=True, progress=False)
    return folder


def _figures(world, out, device: str) -> dict:
    torch.manual_seed(0)
    with exact_fp32():
        code = main(["eval", "--model", "lace-micro-32", "--pretrained", "none", "--device", device,
                     "--benchmarks", "world,retrieval", "--world", str(world),
                     "--data", str(world / "karpathy_coco.json"), "--split", "test", "--no-baseline",
                     "--out", str(out), "--no-progress"])
    assert code == 0
    return json.loads(out.read_text())["benchmarks"]


@pytest.mark.parametrize("device", DEVICES)
def test_lace_eval_on_the_device_gives_the_cpu_figures(device, benchmark_world, tmp_path):
    reference = _figures(benchmark_world, tmp_path / "reference.json", "cpu")
    figures = _figures(benchmark_world, tmp_path / "device.json", device)
    assert set(figures) == {"world", "retrieval"} == set(reference)
    assert {"i2t/all", "winoground/group"} <= set(figures["world"])
    for benchmark, values in reference.items():
        for key, value in values.items():
            if isinstance(value, float):
                assert figures[benchmark][key] == pytest.approx(value, abs=1e-6), f"{benchmark}/{key}"
