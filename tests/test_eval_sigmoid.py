"""Evaluation of a SigLIP-style model: every benchmark ranks by cosine, so the logit bias (and the scale)
change no figure, and zero-shot and retrieval run as for CLIP."""

import json

import pytest
import torch

from lace.cli import main
from lace.data.world import WorldConfig, generate_world
from lace.encoders import load_encoder


@pytest.mark.slow
def test_zeroshot_retrieval_and_benchmarks_of_a_sigmoid_model_do_not_see_its_bias(tmp_path):
    world = tmp_path / "world"
    generate_world(WorldConfig(n_images=40, image_size=32, split_fractions=(0.5, 0.1, 0.3, 0.1),
                               benchmark_items_per_family=1, coco_captions=2), world, overwrite=True, progress=False)
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-sigmoid-32")
    state = encoder.export_state_dict()
    torch.save(state, tmp_path / "initial.pt")
    shifted = dict(state, logit_bias=torch.tensor(3.0), logit_scale=torch.tensor(1.0))
    torch.save(shifted, tmp_path / "shifted.pt")
    assert load_encoder("lace-micro-sigmoid-32", str(tmp_path / "shifted.pt")).logit_bias.item() == 3.0
    results = {}
    for name in ("initial", "shifted"):
        out = tmp_path / f"{name}.json"
        assert main(["eval", "--model", "lace-micro-sigmoid-32", "--pretrained", str(tmp_path / f"{name}.pt"),
                     "--device", "cpu", "--benchmarks", "world,retrieval,zeroshot", "--world", str(world),
                     "--data", str(world / "karpathy_coco.json"), "--split", "test", "--out", str(out),
                     "--no-progress", "--no-baseline"]) == 0
        results[name] = json.loads(out.read_text())
    initial, moved = results["initial"], results["shifted"]
    assert {"world", "retrieval", "zeroshot"} <= set(initial["benchmarks"])
    assert any(key.endswith("/top1") for key in initial["benchmarks"]["zeroshot"])
    assert "i2t/R@1" in initial["benchmarks"]["retrieval"]
    assert initial["benchmarks"] == moved["benchmarks"]
    assert initial["diagnostics"] == moved["diagnostics"]
