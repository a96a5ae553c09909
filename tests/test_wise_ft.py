"""WiSE-FT: `lace export --interpolate ALPHA --base` mixes a run's weights with its base."""

import json

import open_clip
import pytest
import torch

from lace.cli import main
from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.io import read_json
from lace.train import export_run, train
from lace.train.wise_ft import interpolate_state_dicts, read_state_dict
from tests.conftest import tiny_world
from tests.test_train import config_for, pairs_csv  # noqa: F401  (fixture)

MODEL = "lace-micro-32"


@pytest.fixture
def run_and_base(pairs_csv, tmp_path):  # noqa: F811
    """A 2-step run started from a saved random base, and that base."""
    torch.manual_seed(1)
    base = tmp_path / "base.pt"
    torch.save(open_clip.create_model(MODEL).state_dict(), base)
    train(config_for(pairs_csv, tmp_path / "run", steps=2, lr=5e-2, pretrained=str(base)), progress=False)
    return tmp_path / "run", base


def test_alpha_0_is_the_base_1_the_fine_tune_and_linear_in_between(run_and_base, tmp_path):
    run, base = run_and_base
    export_run(run, tmp_path / "tuned.pt")
    tuned, start = read_state_dict(tmp_path / "tuned.pt"), read_state_dict(base)
    moved = [key for key in tuned if tuned[key].is_floating_point() and not torch.equal(tuned[key], start[key])]
    assert moved  # training changed the weights, so the mix has something to mix
    for alpha in (0.0, 0.3, 1.0):
        out = tmp_path / f"mix-{alpha}.safetensors"
        assert main(["export", "--run", str(run), "--out", str(out), "--interpolate", str(alpha),
                     "--base", str(base)]) == 0
        mixed = read_state_dict(out)
        assert set(mixed) == set(tuned)
        for key in moved:
            expected = start[key] + alpha * (tuned[key] - start[key])
            if alpha in (0.0, 1.0):
                assert torch.equal(mixed[key], start[key] if alpha == 0.0 else tuned[key]), key
            else:
                torch.testing.assert_close(mixed[key], expected)
        record = read_json(str(out) + ".json")
        assert record["interpolation"] == {"alpha": alpha, "base": str(base)}
        assert record["model"] == MODEL and record["quick_gelu"] is False
    # the mixed export loads like any export
    assert load_encoder(MODEL, str(tmp_path / "mix-0.3.safetensors")).embed_dim > 0


def test_integer_buffers_are_taken_from_the_fine_tune_not_averaged():
    base = {"w": torch.zeros(2), "count": torch.tensor(4)}
    tuned = {"w": torch.ones(2), "count": torch.tensor(10)}
    mixed = interpolate_state_dicts(base, tuned, 0.5)
    torch.testing.assert_close(mixed["w"], torch.full((2,), 0.5))
    assert mixed["count"].item() == 10 and mixed["count"].dtype == torch.int64


def test_mismatched_architectures_and_activations_are_refused(run_and_base, tmp_path, capsys):
    run, _ = run_and_base
    other = tmp_path / "other.pt"
    torch.save(open_clip.create_model("lace-micro-rn-32").state_dict(), other)
    with pytest.raises(LaceInputError, match="not the architecture of"):
        export_run(run, tmp_path / "x.pt", interpolate=0.5, base=other)
    named = tmp_path / "named.pt"
    torch.save(open_clip.create_model(MODEL).state_dict(), named)
    (tmp_path / "named.pt.json").write_text(json.dumps({"model": "lace-tiny"}))
    with pytest.raises(LaceInputError, match="field 'model'"):
        export_run(run, tmp_path / "x.pt", interpolate=0.5, base=named)
    (tmp_path / "named.pt.json").write_text(json.dumps({"model": MODEL, "quick_gelu": True}))
    with pytest.raises(LaceInputError, match="QuickGELU"):
        export_run(run, tmp_path / "x.pt", interpolate=0.5, base=named)
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x.pt"), "--interpolate", "1.5",
                 "--base", str(named)]) == 2
    assert "[0, 1]" in capsys.readouterr().err
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x.pt"), "--interpolate", "0.5"]) == 2
    assert "--base" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.slow
def test_the_tradeoff_curve_runs_from_the_base_to_each_fine_tune(tmp_path):
    from lace.eval.runner import EvalConfig, run_evaluation
    from lace.experiment.wise_ft import wise_ft_tradeoff
    from lace.experiment.zeroshot import zeroshot_top1

    world = tiny_world(tmp_path / "world", 40, (0.5, 0.1, 0.3, 0.1), benchmark_items_per_family=1, coco_captions=2)
    torch.manual_seed(0)
    base = open_clip.create_model(MODEL).state_dict()
    tuned = open_clip.create_model(MODEL).state_dict()  # another random draw stands in for a fine-tune
    config = EvalConfig(world=str(world), zeroshot_per_class=2)
    points, png = wise_ft_tradeoff(MODEL, base, {"tuned": tuned}, [0.0, 0.5, 1.0], config, tmp_path / "wise.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p["alpha"] for p in points] == [0.0, 0.5, 1.0]

    def direct(state):
        torch.save(state, tmp_path / "direct.pt")
        encoder = load_encoder(MODEL, str(tmp_path / "direct.pt"))
        figures = run_evaluation(encoder, EvalConfig(benchmarks=("zeroshot", "world"), world=str(world),
                                                     zeroshot_per_class=2, diagnostics=False), MODEL)["benchmarks"]
        return zeroshot_top1(figures), figures["world"]["i2t/swap_attribute"]

    for point, state in ((points[0], base), (points[2], tuned)):
        assert (point["zeroshot/top1"], point["world/i2t/swap_attribute"]) == pytest.approx(direct(state))
