"""`lace demo-draws`: demo runs from several base draws on one world, pooled, with the pre-registered targets."""

import json
from pathlib import Path

import pytest

from lace.cli import main
from lace.config import config_to_dict
from lace.data.world import WorldConfig
from lace.demo import DemoConfig
from lace.demo.draws import combine_draws, pooled_figures, read_draws
from lace.demo.pipeline import base_stage_key, finetune_folder, world_config, world_key
from lace.errors import LaceInputError
from lace.experiment.stages import stage_key

BEST = "LACE-local pairs"
SWAPS = ("i2t/swap_attribute", "t2i/swap_attribute", "i2t/swap_object", "t2i/swap_object")


def _split(swap: float, r1: float = 0.5, **figures: float) -> dict:
    """One split's results: every swap family at `swap` (or as given by name, '/' as '_'), R@1 at `r1`."""
    world = {key: figures.get(key.replace("/", "_"), swap) for key in SWAPS}
    return {"benchmarks": {"world": world, "retrieval": {"i2t/R@1": r1, "t2i/R@1": r1}}, "diagnostics": {}}


def _model(test: float, comp: float, val: float, r1: float = 0.5, **figures: float) -> dict:
    return {"test": _split(test, r1, **figures), "test_comp": _split(comp, r1), "val": _split(val, r1)}


def _evaluations(shift: float) -> dict:
    """Two seeds of each arm, every figure moved by `shift` (the draw) and by +-0.01 (the seed)."""
    arms = {  # (test, test_comp, val) swap figures
        "plain": (0.60, 0.55, 0.60),
        "caption negatives": (0.66, 0.56, 0.66),
        BEST: (0.75, 0.70, 0.74),  # the best pairs arm on validation, though worse on test than the column arm
        "LACE-local pairs + column": (0.80, 0.71, 0.70),
        "LACE-local pairs + caption negatives": (0.68, 0.57, 0.70),  # +0.02 over caption negatives: interference
    }
    evaluations = {"base": _model(0.55 + shift, 0.5, 0.55)}
    for arm, (test, comp, val) in arms.items():
        for seed, jitter in ((0, -0.01), (1, 0.01)):
            evaluations[f"{arm} seed {seed}"] = _model(test + shift + jitter, comp + shift, val + shift,
                                                       r1=0.47 if arm == BEST else 0.5)
    return evaluations


def _run(folder: Path, base_seed: int | None, shift: float, world_seed: int = 0) -> Path:
    config = DemoConfig(seed=world_seed, base_seed=base_seed, seeds=2)
    summary = {"config": config_to_dict(config), "world": config_to_dict(world_config(config)),
               "evaluations": _evaluations(shift),
               "provenance": {f"{BEST} seed {seed}": {"local": {"probe_auc": auc}}
                              for seed, auc in ((0, 0.6), (1, 0.64))}}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(summary))
    for seed in (0, 1):  # the editor's valid rows fall from 0.8 to 0.76 (95%), the edited images win 0.55
        run = finetune_folder(folder, BEST, seed)
        run.mkdir(parents=True)
        rows = [{"step": 25, "pair_rows_valid": 0.8}, {"step": 50, "pair_rows_valid": 0.76,
                                                        "provenance_edited_caption_prefers_edited_image": 0.55}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.fixture
def runs(tmp_path):
    return [_run(tmp_path / "draw0", None, 0.0), _run(tmp_path / "draw1", 1, 0.02)]


def test_figures_pool_draws_and_seeds_and_split_their_spreads(runs):
    table = pooled_figures(read_draws(runs), "test")
    column = 0  # i2t swap-att
    best = table[BEST][column]
    assert best.mean == pytest.approx(0.76) and best.draws == 2 and best.runs == 4
    assert best.across_draws == pytest.approx(0.02 / 2 ** 0.5)  # per-draw means 0.75 and 0.77, sample std
    assert best.across_seeds == pytest.approx(0.02 / 2 ** 0.5)  # 0.74 and 0.76 in each draw
    base = table["base"][column]
    assert base.mean == pytest.approx(0.56) and base.across_seeds is None  # one base per draw


def test_targets_are_met_missed_or_not_decided_for_the_arm_chosen_on_validation(runs):
    result = combine_draws(read_draws(runs))
    assert result["best"]["variant"] == BEST  # val 0.75 > 0.71, though the column arm is better on test
    targets = {(target["text"], target["split"]): target for target in result["targets"]}
    assert len(targets) == len(result["targets"])
    beats = targets[f"{BEST} beats plain by >= 10 points on i2t swap-att", "test"]
    assert beats["met"] is True and beats["margin"] == pytest.approx(0.05)  # 0.76 - 0.61 - 0.10
    assert beats["interval"][0] >= 0.10 and beats["n"] == "n = 4 runs"  # every resample of the 4 runs clears it
    recall = targets[f"{BEST} keeps R@1 i2t within 2 points of plain", "test"]
    assert recall["met"] is False and recall["margin"] == pytest.approx(-0.01)  # 0.47 - 0.50 + 0.02
    interference = f"no interference: {BEST} + caption negatives beats caption negatives by >= 3 points on t2i swap-obj"
    # +0.02 against 3 points, but the runs spread by 0.04: the interval straddles the threshold
    assert targets[interference, "test"]["status"] == "not decided" and targets[interference, "test"]["met"] is None
    assert targets[interference, "test"]["interval"][0] < 0.03 < targets[interference, "test"]["interval"][1]
    assert targets[interference, "test"]["margin"] == pytest.approx(-0.01)
    assert targets[interference, "test_comp"]["margin"] == pytest.approx(-0.02)  # +0.01
    assert targets[interference, "test_comp"]["status"] == "missed"
    editor = next(t for t in result["targets"] if t["text"].startswith("editor"))
    assert editor["met"] is True and editor["margin"] == pytest.approx(0.76 - 0.72)
    probe = next(t for t in result["targets"] if "probe AUC" in t["text"])
    assert probe["met"] is True and probe["margin"] == pytest.approx(0.65 - 0.62)
    ceiling = next(t for t in result["targets"] if "ceiling" in t["text"])
    assert ceiling["status"] == "not run" and ceiling["met"] is None  # no ceiling was run: never met


def test_the_command_writes_the_report_and_refuses_to_clobber(runs, tmp_path, capsys):
    out = tmp_path / "draws.md"
    assert main(["demo-draws", *map(str, runs), "--out", str(out), "--best", "LACE-local pairs + column"]) == 0
    report, data = out.read_text(), json.loads(out.with_suffix(".json").read_text())
    assert data["best"] == {"variant": "LACE-local pairs + column", "chosen_by": "given"}
    editor = next(t for t in data["targets"] if t["text"].startswith("editor"))
    assert editor["status"] == "not measured"  # the arm ran; no metrics.jsonl of it logs its valid rows
    assert "## Pre-registered targets" in report and "| not run |" in report and "| met |" in report
    assert "| LACE-local pairs + column | 0.810 ±0.014 ±0.014 |" in report  # test i2t swap-att, sample stds
    assert "| n = 4 runs |" in report and "95% interval" in report
    assert main(["demo-draws", *map(str, runs), "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["demo-draws", *map(str, runs), "--out", str(out), "--overwrite"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["best"]["variant"] == BEST


def test_runs_on_another_world_or_the_same_base_draw_are_refused(runs, tmp_path, capsys):
    other = _run(tmp_path / "other", 2, 0.0, world_seed=1)
    assert main(["demo-draws", str(runs[0]), str(other), "--out", str(tmp_path / "x.md")]) == 2
    error = capsys.readouterr().err
    assert f"{other / 'results.json'}: field 'world.seed': expected 0" in error and "got 1" in error
    again = _run(tmp_path / "again", 1, 0.0)  # draw 1's seed, another base
    assert main(["demo-draws", str(runs[1]), str(again), "--out", str(tmp_path / "x.md")]) == 2
    assert "field 'evaluations.base'" in capsys.readouterr().err
    twice = _run(tmp_path / "twice", 1, 0.02)  # draw 1 again, the same fine-tunes
    assert main(["demo-draws", str(runs[1]), str(twice), "--out", str(tmp_path / "x.md")]) == 2
    error = capsys.readouterr().err
    assert "field 'evaluations'" in error and "plain seed 0" in error
    assert main(["demo-draws", *map(str, runs), "--out", str(tmp_path / "x.md"), "--best", "LACE"]) == 2
    assert "field 'best'" in capsys.readouterr().err
    assert not (tmp_path / "x.md").exists()


def test_a_setting_one_run_does_not_record_is_not_compared(runs):
    summary = json.loads((runs[1] / "results.json").read_text())
    del summary["config"]["finetune"]["edited_rows_weight"]  # written before the setting existed
    (runs[1] / "results.json").write_text(json.dumps(summary))
    assert len(read_draws(runs)) == 2
    summary["config"]["finetune"]["steps"] = 1  # a setting both record, changed
    (runs[1] / "results.json").write_text(json.dumps(summary))
    with pytest.raises(LaceInputError, match="config.finetune.steps"):
        read_draws(runs)


def test_runs_of_one_draw_from_the_same_base_are_read_as_one(runs, tmp_path):
    whole = combine_draws(read_draws(runs))
    # draw 1 again, as two runs from its base: the best arm's fine-tunes (and their logs) in a second folder
    first, second = _run(tmp_path / "part0", 1, 0.02), _run(tmp_path / "part1", 1, 0.02)
    for folder, keep in ((first, lambda model: not model.startswith(BEST)), (second, lambda model: model == "base"
                                                                              or model.startswith(BEST))):
        summary = json.loads((folder / "results.json").read_text())
        summary["evaluations"] = {m: v for m, v in summary["evaluations"].items() if keep(m)}
        summary["provenance"] = {m: v for m, v in summary["provenance"].items() if keep(m)}
        summary["evaluations"]["base"]["test"]["seconds"] = {"world": 1.0 if folder == first else 2.0}  # timing only
        (folder / "results.json").write_text(json.dumps(summary))
    for seed in (0, 1):
        (finetune_folder(first, BEST, seed) / "metrics.jsonl").unlink()
    parts = combine_draws(read_draws([runs[0], first, second]))
    assert parts["base_seeds"] == [0, 1] and len(parts["runs"]) == 3
    assert parts["runs"] == [Path(run).name for run in (runs[0], first, second)]  # folder names, no machine paths
    assert parts["figures"] == whole["figures"] and parts["best"] == whole["best"]
    assert [t["status"] for t in parts["targets"]] == [t["status"] for t in whole["targets"]]
    assert [t["evidence"] for t in parts["targets"]] == [t["evidence"] for t in whole["targets"]]


def test_the_base_seed_changes_the_base_key_only_when_set_to_another_seed():
    world = world_key(WorldConfig())
    default = DemoConfig()
    # the formula of the default demo's base key before --base-seed existed: cached bases stay valid
    assert base_stage_key(default, world) == stage_key(world, default.model, default.base_steps, default.base_lr,
                                                       default.batch_size, default.seed)
    assert base_stage_key(DemoConfig(base_seed=0), world) == base_stage_key(default, world)
    assert base_stage_key(DemoConfig(base_seed=1), world) != base_stage_key(default, world)
    assert DemoConfig(base_seed=1).pretraining_seed == 1 and DemoConfig(seed=3).pretraining_seed == 3
