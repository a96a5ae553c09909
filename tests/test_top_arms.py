"""The training arms of the tower tops: arms read from the variants table, each arm's negatives,
training every arm from one start, and the Flickr8k arms run end to end on a tiny dataset."""

from __future__ import annotations

import copy
import json
import re
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from lace.config import config_from_dict, with_changes
from lace.demo.config import DemoConfig
from lace.edits import EditConfig
from lace.encoders import load_encoder
from lace.encoders.towers.top import TowersTop
from lace.encoders.towers.top_features import encode_captions
from lace.errors import LaceInputError
from lace.experiment.variants import VARIANTS, variant_config
from lace.local.config import LocalEditConfig
from lace.losses import lace_loss
from lace.study.config import TOP_ARMS, TopsStudyConfig
from lace.study.flickr8k_top_arms import arm_train_config
from lace.study.heads import train_summary
from lace.train.data import TopBatch, TopPairs
from lace.train.local_arm import map_negatives
from lace.train.loop import Trainer
from tests.towers_support import (
    CUT_CHANNELS,
    CUT_GRID,
    ONE_PROCESS,
    PAINTS,
    TINY_FINETUNE,
    TINY_HEADS,
    make_coloured_flickr8k,
    object_maps,
    tiny_pairs,
    token_states,
    top_trainer,
)


def image_top_grads(top: TowersTop) -> list[torch.Tensor | None]:
    return [top.image_top.stages[0][0].conv_pw.weight.grad, top.image_top.conv_head.weight.grad]


# --- arms: the rows of the variants table, refused where the cached inputs cannot serve them ----------------


def test_every_top_arm_is_its_variant_row_on_the_study_finetune(tmp_path):
    config = TopsStudyConfig(data="d", out="o", finetune=TINY_FINETUNE)
    for name in TOP_ARMS:
        made = arm_train_config(config, name, seed=1, n_images=3, output=tmp_path)
        for field, value in VARIANTS[name].items():
            assert getattr(made.arm, field) == value if not isinstance(value, dict) else True, (name, field)
        assert made.run.seed == 1 and made.run.batch_size == 3
        # the fine-tune's negatives, with the arm's own local knobs (symmetric, operator) where it has them
        own_local = VARIANTS[name].get("local", {})
        assert made.negatives == with_changes(config.finetune.negatives, {"local": own_local} if own_local else {})
        assert all(getattr(made.negatives.local, knob) == value for knob, value in own_local.items())
    assert {name for name in TOP_ARMS if VARIANTS[name].get("local")} == {
        name for name, changes in VARIANTS.items() if changes.get("local", {}).get("symmetric") in ("round_trip", "no_op")
        or changes.get("local", {}).get("operator") == "learnt"}  # every symmetric and learnt arm but the nuisance


@pytest.mark.parametrize("field, value", [("seed", 3), ("caption_negatives", True), ("model", "lace-micro-32")])
def test_a_finetune_setting_the_study_sets_itself_is_refused_not_overwritten(field, value):
    """The study sets the model, data and seeds and each arm its switches: the same setting given inside `finetune`
    (in YAML, or as a change) is refused rather than silently replaced."""
    with pytest.raises(LaceInputError, match=rf"field 'finetune\.{field}': expected .*: the study sets it"):
        config_from_dict(TopsStudyConfig, {"data": "d", "out": "o", "finetune": {field: value}})
    with pytest.raises(LaceInputError, match=rf"field 'finetune\.{field}': expected .*: the study sets it"):
        with_changes(TopsStudyConfig(data="d", out="o"), {"finetune": {field: value}})


def test_the_study_trains_with_the_one_editor_its_finetune_holds(tmp_path):
    """The editors live in the fine-tune's negatives only: `edit:` and `finetune: {edit: ...}` are one knob, which
    the arms train with; two different values for it are refused."""
    config = config_from_dict(TopsStudyConfig, {"data": "d", "out": "o", "edit": {"n_edits": 2},
                                                "finetune": {"local": {"n_edits": 5}}})
    made = arm_train_config(config, "LACE", seed=0, n_images=4, output=tmp_path)
    assert made.negatives.edit == EditConfig(n_edits=2) and made.negatives.local == LocalEditConfig(n_edits=5)
    with pytest.raises(LaceInputError, match="also given"):
        config_from_dict(TopsStudyConfig, {"data": "d", "out": "o", "edit": {"n_edits": 2},
                                           "finetune": {"edit": {"n_edits": 3}}})


@pytest.mark.parametrize("field, value", [("seed", 3), ("caption_negatives", True), ("model", "lace-micro-32")])
def test_the_demo_and_the_tops_study_refuse_a_setting_of_theirs_in_the_same_words(field, value):
    with pytest.raises(LaceInputError) as tops:
        with_changes(TopsStudyConfig(data="d", out="o"), {"finetune": {field: value}})
    with pytest.raises(LaceInputError) as demo:
        with_changes(DemoConfig(), {"finetune": {field: value}})
    pattern = rf"^.+: field 'finetune\.{field}': expected .+: the (study|demo) sets it \(.+\) \(got {value!r}\)$"
    assert re.match(pattern, str(tops.value)) and re.match(pattern, str(demo.value))


@pytest.mark.parametrize("name, field", [("LACE-local + caption swaps", "local_caption_swaps"),
                                         ("ceiling (rendered swaps)", "rendered_negatives")])
def test_arms_that_need_pixels_or_tokens_below_the_cut_are_refused(top, tmp_path, name, field):
    with pytest.raises(LaceInputError, match="need pixels or tokens") as refused:
        top_trainer(top, name, tmp_path, local_editor=object())
    assert field in str(refused.value)


def test_an_arm_without_its_source_is_refused_naming_it(top, tmp_path):
    with pytest.raises(LaceInputError, match="token states of the rule-made captions"):
        top_trainer(top, "caption negatives", tmp_path, tiny_pairs(negatives=False))
    with pytest.raises(LaceInputError, match="MapEditor"):
        top_trainer(top, "LACE-local", tmp_path)
    with pytest.raises(LaceInputError, match="a TowersTop"):
        Trainer(variant_config(with_changes(TINY_FINETUNE.train_config(), {"output": str(tmp_path / "x")}), "plain"),
                ONE_PROCESS, None, tiny_pairs(), False, None, encoder=top.encoder)


# --- negatives of one batch ----------------------------------------------------------------------


def test_local_image_negatives_carry_gradient_into_the_image_top(top, map_editor):
    maps = object_maps(4)
    negatives, valid, _ = map_negatives(top.encode_image_states, top.embed_dim, map_editor, maps, 2, [0, 1, 2, 3])
    assert negatives.shape == (4, 2, 8) and valid.shape == (4, 2) and valid[:, 0].all()
    torch.testing.assert_close(negatives[valid].norm(dim=-1), torch.ones(int(valid.sum())))
    top.zero_grad(set_to_none=True)
    negatives[valid].sum().backward()  # the negatives alone, no unedited pass
    assert all(grad is not None and grad.abs().sum() > 0 for grad in image_top_grads(top))
    assert top.text_top.layers[-1].output.dense.weight.grad is None
    top.zero_grad(set_to_none=True)
    again, _, _ = map_negatives(top.encode_image_states, top.embed_dim, map_editor, maps[1:], 2, [1, 2, 3])
    torch.testing.assert_close(again, negatives[1:].detach())  # a row's edits are its own seed's


def test_maps_without_objects_give_invalid_slots_and_the_plain_loss(top, map_editor, tmp_path):
    noise = 0.05 * torch.randn(2, CUT_CHANNELS, *CUT_GRID, generator=torch.Generator().manual_seed(0))
    maps = torch.cat([object_maps(2), noise])  # two images with objects, two without
    trainer = top_trainer(top, "LACE-local", tmp_path, local_editor=map_editor)
    with torch.no_grad():
        micro, negatives = trainer.embed(TopBatch(maps, np.arange(4), [0, 1, 2, 3]), 0)
        U, V, scale = micro.U, micro.V, micro.scale
        assert negatives.caption_negatives is None
        assert negatives.image_valid[:2, 0].all() and not negatives.image_valid[2:].any()
        assert negatives.image_negatives[2:].abs().sum() == 0
        plain = lace_loss(U, V, scale)
        with_objects = lace_loss(U, V, scale, image_negatives=negatives.image_negatives,
                                 image_valid=negatives.image_valid)
        assert with_objects > plain  # valid negatives add to the loss
        masked = lace_loss(U[2:], V[2:], scale, image_negatives=negatives.image_negatives[2:],
                           image_valid=negatives.image_valid[2:])
        torch.testing.assert_close(masked, lace_loss(U[2:], V[2:], scale))


def test_caption_negatives_are_the_rule_rows_and_rows_without_one_are_invalid(top, tmp_path):
    tokens, rule_tokens = token_states(4), token_states(3, seed=1)
    maps = object_maps(4).numpy().astype(np.float16)
    rule_of = np.array([2, -1, 0, 1])  # caption row r's negative is rule row rule_of[r]; caption 1 has none
    pairs = TopPairs(maps, tokens, np.arange(4), np.arange(4), rule_tokens, rule_of)
    trainer = top_trainer(top, "caption negatives", tmp_path, pairs)
    batch = pairs.collate([pairs[sample] for sample in trainer.order.micro_batch(0)])
    with torch.no_grad():
        micro, negatives = trainer.embed(batch, 0)
        V = micro.V
        assert negatives.image_negatives is None and negatives.caption_negatives.shape == (4, 1, 8)
        assert negatives.caption_valid[:, 0].tolist() == [rule_of[r] >= 0 for r in batch.caption_rows]
        for i, row in enumerate(batch.caption_rows):
            if rule_of[row] >= 0:
                torch.testing.assert_close(negatives.caption_negatives[i, 0],
                                           encode_captions(top, rule_tokens, [rule_of[row]])[0])
            else:
                assert negatives.caption_negatives[i].abs().sum() == 0
        torch.testing.assert_close(V, encode_captions(top, tokens, batch.caption_rows))


# --- training -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_arm_trains_from_one_start_and_plain_ignores_the_sources(top, map_editor, tmp_path):
    runs = {}
    for name, arm, given in (("plain", "plain", {}), ("plain with sources", "plain", {"local_editor": map_editor}),
                             ("LACE-local", "LACE-local", {"local_editor": map_editor})):
        model = copy.deepcopy(top)
        config = variant_config(with_changes(TINY_FINETUNE.train_config(), {"model": "lace-towers", "output": str(tmp_path / "run"), "vocabulary": "natural", "checkpoint_every": 0, "log_every": 1}), arm)
        runs[name] = (model, train_summary(config, False, dataset=tiny_pairs(), encoder=model, **given))
    steps = {name: summary["steps"] for name, (_, summary) in runs.items()}
    assert steps == {"plain": 2, "plain with sources": 2, "LACE-local": 2}  # one caption per image: 8 images, 4 a batch
    plain, with_sources, local = (dict(runs[name][0].named_parameters())
                                  for name in ("plain", "plain with sources", "LACE-local"))
    head = "encoder.image_tower.model.conv_head.weight"  # the image top's last convolution
    assert not torch.equal(plain[head], top.image_top.conv_head.weight)  # training moved the image top
    assert all(torch.equal(plain[key], with_sources[key]) for key in plain)
    assert not torch.equal(plain[head], local[head])
    assert "image_negative_rows" not in runs["plain"][1]
    assert 0.5 <= runs["LACE-local"][1]["image_negative_rows"] <= 1.0


def test_the_pretrained_tops_train_at_their_own_learning_rate(top, tmp_path):
    trainer = top_trainer(top, "plain", tmp_path)
    scales = sorted({group["lr_scale"] for group in trainer.optimizer.param_groups if group["params"]})
    assert scales == [0.1, 1.0]
    tops = {id(p) for p in top.pretrained_parameters()}
    for group in trainer.optimizer.param_groups:
        assert all((id(p) in tops) == (group["lr_scale"] == 0.1) for p in group["params"])
    assert any(id(top.logit_scale) == id(p) for g in trainer.optimizer.param_groups if g["lr_scale"] == 1.0
               for p in g["params"])


# --- Flickr8k arms end to end --------------------------------------------------------------------

def tiny_study(data, out, **changes) -> TopsStudyConfig:
    return TopsStudyConfig(data=str(data), out=str(out), base=TINY_HEADS, finetune=TINY_FINETUNE, seeds=1,
                           items_per_kind=8, progress=False, **changes)


FOUR_ARMS = ("plain", "caption negatives", "LACE-local", "LACE-local pairs + caption negatives")


@pytest.fixture(scope="module")
def four_arm_study(tmp_path_factory):
    """The study of four arms on a tiny coloured Flickr8k, run once: (data, its folder, the result, the log lines). A
    test that runs the study again works on a copy of the folder (`copy_study`), which keeps every stage it holds."""
    from lace.study.flickr8k_top_arms import run_tops_study

    root = tmp_path_factory.mktemp("tops")
    data, out = make_coloured_flickr8k(root / "flickr8k", 16), root / "out"
    lines: list[str] = []
    result = run_tops_study(tiny_study(data, out, arms=FOUR_ARMS), log=lines.append)
    return data, out, result, lines


def copy_study(out, folder):
    """A copy of study folder `out` at `folder`, file times kept (the stages are keyed on the data, not the folder)."""
    return shutil.copytree(out, folder, symlinks=True)


@pytest.mark.slow
def test_the_study_trains_saves_and_reuses_every_arm_through_the_trainer(four_arm_study, tmp_path):
    from lace.experiment.protocol import Run
    from lace.study.flickr8k_top_arms import run_tops_study

    data, first, result, lines = four_arm_study
    arms = FOUR_ARMS
    assert set(result["summary"]) == {"base", *arms}
    written = json.loads((first / "arms-val.json").read_text())
    assert written["arms"] == list(arms) and written["config"]["finetune"]["lr"] == TINY_FINETUNE.optim.lr
    assert "| LACE-local |" in (first / "arms-val.md").read_text() and "local_editor" in result
    assert sum("[train-" in line and "running" in line for line in lines) == len(arms)
    out = copy_study(first, tmp_path / "out")  # the runs below write into their folder
    stages = {arm: json.loads((out / "stages" / f"{Run(arm, 0).stage('train')}.json").read_text()) for arm in arms}
    checkpoints = {arm: out / stage["result"]["checkpoint"] for arm, stage in stages.items()}
    base = load_encoder("lace-towers", pretrained=str(out / "models" / "base.safetensors"))
    for arm, path in checkpoints.items():
        loaded = load_encoder("lace-towers", pretrained=str(path))
        changed = loaded.image_tower.blocks[-1].conv_pwl.weight
        assert not torch.equal(changed, base.image_tower.blocks[-1].conv_pwl.weight), arm
        assert stages[arm]["result"]["steps"] == stages["plain"]["result"]["steps"]
    assert "image_negative_rows" in stages["LACE-local"]["result"]
    assert "caption_negative_rows" in stages["caption negatives"]["result"]
    # the study's TopPairs carry the caption texts and the text tower below the cut, which the pairs arm needs
    assert {"pair_rows", "rule_collision_rows"} <= set(stages["LACE-local pairs + caption negatives"]["result"])
    assert "pair_rows" not in stages["LACE-local"]["result"]
    trained_at = {arm: path.stat().st_mtime_ns for arm, path in checkpoints.items()}

    lines = []
    again = run_tops_study(tiny_study(data, out, arms=arms), log=lines.append)
    assert not any("running" in line for line in lines)
    assert {arm: path.stat().st_mtime_ns for arm, path in checkpoints.items()} == trained_at
    assert again["summary"] == result["summary"]

    lines.clear()  # another split measures the same models without training them again
    test = run_tops_study(tiny_study(data, out, arms=arms, split="test"), log=lines.append)
    assert [line for line in lines if "running" in line] == ["[test-base] running"] + [
        f"[{Run(arm, 0).stage('test')}] running" for arm in arms]
    assert test["split"] == "test" and (out / "arms-test.md").is_file()


@pytest.mark.slow
def test_the_study_scores_zero_shot_on_an_image_folder_for_the_base_and_every_arm(four_arm_study, tmp_path):
    from lace.experiment.protocol import Run
    from lace.study.flickr8k_top_arms import run_tops_study

    data, first, _, _ = four_arm_study
    out, classes = copy_study(first, tmp_path / "out"), tmp_path / "classes"  # its base and plain arm, trained
    for name, colour in (("red thing", "red"), ("blue thing", "blue")):
        (classes / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (32, 32), PAINTS[colour]).save(classes / name / f"{i}.png")
    lines: list[str] = []
    result = run_tops_study(tiny_study(data, out, arms=("plain",), zeroshot_root=str(classes)), log=lines.append)
    # the zero-shot folder is part of what a measurement is keyed on: base and plain are measured again
    assert [line for line in lines if "running" in line] == ["[val-base] running", f"[{Run('plain', 0).stage('val')}] running"]
    for run in (result["runs"]["base"][0], result["runs"]["plain"][0]):
        top1 = [key for key in run if key.startswith("zeroshot/") and key.endswith("top1")]
        assert top1 and all(0.0 <= run[key] <= 1.0 for key in top1)
    assert any(key.startswith("zeroshot/") for key in result["summary"]["plain"])


def test_lace_study_flickr8k_tops_passes_every_flag_it_shows(tmp_path, monkeypatch):
    """--edit-*, --zeroshot-*, --overwrite, --no-progress and the study's own knobs reach the config it runs."""
    import lace.study.flickr8k_top_arms as arms_module
    from lace.cli import main

    ran = []
    monkeypatch.setattr(arms_module, "run_tops_study", lambda config: ran.append(config) or {"split": config.split})
    data, out = make_coloured_flickr8k(tmp_path / "flickr8k", 4), tmp_path / "study"
    out.mkdir()
    (out / "someone's file").write_text("kept unless --overwrite")
    flags = ["study", "flickr8k", "--tops", "--data", str(data), "--out", str(out), "--arms", "plain,LACE",
             "--seeds", "2", "--edit-strength", "4", "--edit-target", "hard", "--no-edit-effect-check",
             "--zeroshot-root", str(tmp_path / "classes"), "--zeroshot-classnames", "names.txt",
             "--zeroshot-templates", "templates.txt", "--no-progress", "--finetune-lr", "0.002",
             "--finetune-pretrained-lr-scale", "0.5", "--local-n-edits", "3", "--dictionary-atoms", "64",
             "--base-epochs", "2", "--split", "test"]
    assert main(flags) != 0 and not ran  # refused: the folder holds someone's file
    assert (out / "someone's file").is_file()
    assert main([*flags, "--overwrite"]) == 0
    (config,) = ran
    assert not (out / "someone's file").exists()
    edit = config.finetune.negatives.edit
    assert (edit.strength, edit.target, edit.effect_check) == (4.0, "hard", False)
    assert (config.zeroshot_root, config.zeroshot_classnames, config.zeroshot_templates) == (
        str(tmp_path / "classes"), "names.txt", "templates.txt")
    assert config.progress is False and config.seeds == 2 and config.arms == ("plain", "LACE")
    assert (config.finetune.optim.lr, config.finetune.optim.pretrained_lr_scale, config.finetune.epochs) == (
        0.002, 0.5, 8.0)
    assert (config.finetune.negatives.local.n_edits, config.dictionary.atoms, config.base.epochs, config.split) == (3, 64, 2, "test")
    made = arm_train_config(config, "LACE", seed=1, n_images=100, output=tmp_path)
    assert made.negatives.edit == config.finetune.negatives.edit and made.optim.lr == 0.002 \
        and made.arm.counterfactual_images


def _runs(plain: tuple[float, ...], local: tuple[float, ...], r_at_1: tuple[float, ...]) -> dict[str, list[dict]]:
    """Per-seed figures: swap_att = swap_obj as given per seed, both R@1 at `r_at_1` for LACE-local (plain 0.5)."""
    def arm(swaps, recalls):
        return [{"sugarcrepe_style/swap_att": swap, "sugarcrepe_style/swap_obj": swap, "i2t/R@1": recall,
                 "t2i/R@1": recall} for swap, recall in zip(swaps, recalls)]

    return {"plain": arm(plain, (0.5,) * len(plain)), "LACE-local": arm(local, r_at_1)}


def _summary(runs: dict[str, list[dict]]) -> dict:
    from lace.experiment.summary import summarise_over_seeds

    return summarise_over_seeds(runs, ("sugarcrepe_style/swap_att", "sugarcrepe_style/swap_obj", "i2t/R@1", "t2i/R@1"))


def test_target_checks_decide_by_a_bootstrap_interval_over_seeds():
    from lace.study.flickr8k_top_arms import target_checks

    # every seed of LACE-local above every seed of plain, retrieval within 2 points at every seed
    met = target_checks(_runs((0.60, 0.61, 0.59), (0.63, 0.64, 0.62), r_at_1=(0.485, 0.49, 0.488)), "LACE-local")
    assert [check.status for check in met] == ["met"] * 4
    assert met[0].text == "LACE-local beats plain on i2t swap_att" and met[0].n == "n = 3 runs"
    # +3 points on the means, but the seeds overlap: not decided; retrieval 3 points down at every seed: missed
    mixed = target_checks(_runs((0.58, 0.62, 0.60), (0.66, 0.57, 0.66), r_at_1=(0.47, 0.47, 0.47)), "LACE-local")
    assert [check.status for check in mixed] == ["not decided", "not decided", "missed", "missed"]
    assert "LACE-local 0.630 vs plain 0.600 (+0.030)" in mixed[0].evidence
    assert target_checks({"plain": []}) == []
    # one seed each, with the measured items kept: +8 points on 400 items is decided by the items alone
    one_seed = {arm: [figures[0] | {"items": {"sugarcrepe_style/swap_att": [1] * right + [0] * (400 - right)}}]
                for (arm, figures), right in zip(_runs((0.60,), (0.68,), r_at_1=(0.5,)).items(), (240, 272))}
    checks = target_checks(one_seed, "LACE-local")
    assert checks[0].status == "met" and checks[0].n == "n = 400 items × 1 run"
    assert checks[1].status == "not decided" and checks[1].n == "n = 1 run"  # swap_obj kept no items


def test_the_arms_table_checks_the_targets_of_every_lace_arm_it_ran():
    from lace.study.flickr8k_top_arms import arms_table

    runs = _runs((0.60, 0.61, 0.59), (0.63, 0.64, 0.62), r_at_1=(0.485, 0.49, 0.488))
    runs["LACE-local pairs"] = [figures | {"sugarcrepe_style/swap_att": 0.55} for figures in runs["LACE-local"]]
    runs["LACE-local + caption negatives"] = runs["LACE-local"]  # no role: its targets are not checked
    table = arms_table({"split": "val", "summary": _summary(runs), "runs": runs})
    assert "targets for LACE-local against plain" in table and "targets for LACE-local pairs against plain" in table
    assert "targets for LACE-local + caption negatives" not in table
    assert "- met: LACE-local beats plain on i2t swap_att" in table
    assert "- missed: LACE-local pairs beats plain on i2t swap_att" in table
    assert "95% interval [" in table and "n = 3 runs" in table
    single = {arm: figures[:1] for arm, figures in runs.items()}
    one_seed = arms_table({"split": "val", "summary": _summary(single), "runs": single})
    assert "| 0.600 (1) |" in one_seed and "± 0.000" not in one_seed  # a single run is no mean ± std
    assert "- not decided (n = 1 run): LACE-local beats plain on i2t swap_att" in one_seed
