"""The training arms of the tower tops: arms read from the variants table, each arm's negatives,
training every arm from one start, and the Flickr8k arms run end to end on a tiny dataset."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from lace.encoders import load_encoder
from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.encoders.towers.top import TowersTop
from lace.encoders.towers.top_features import TokenStates, encode_captions
from lace.errors import LaceInputError
from lace.experiment.variants import VARIANTS
from lace.losses import lace_loss
from lace.study.flickr8k_top_arms import TOP_ARMS
from lace.study.top_negatives import (
    RuleStates,
    TopArm,
    TopNegativeSources,
    batch_negatives,
    local_image_negatives,
    top_arm,
)
from lace.study.top_training import TopSplit, TopTraining, train_top
from tests.test_local_maps import coloured_maps, fit_coloured_editor

CUT_GRID = (7, 7)
CUT_CHANNELS = 192
TINY = TopTraining(hidden_dim=16, dropout=0.1, embed_dim=8, epochs=1, batch_size=4, warmup_steps=1)


@pytest.fixture(scope="module")
def top() -> TowersTop:
    torch.manual_seed(0)
    return TowersTop(TowersDualEncoder(TowersConfig(embed_dim=8, head_hidden_dim=16, head_dropout=0.1))).eval()


@pytest.fixture(scope="module")
def map_editor():
    """A map editor of four colours fitted on hand-built maps of the cut's shape (192, 7, 7)."""
    return fit_coloured_editor(channels=CUT_CHANNELS, grid=CUT_GRID, n_images=120)


def object_maps(n_images: int, seed: int = 1) -> torch.Tensor:
    return coloured_maps(n_images, seed=seed, channels=CUT_CHANNELS, grid=CUT_GRID)[0]


def token_states(n_captions: int, seed: int = 0) -> TokenStates:
    """Random cached token states of `n_captions` captions of 3 to 6 tokens."""
    generator = np.random.default_rng(seed)
    lengths = generator.integers(3, 7, size=n_captions)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return TokenStates(generator.standard_normal((offsets[-1], 384)).astype(np.float16), offsets)


def image_top_grads(top: TowersTop) -> list[torch.Tensor | None]:
    return [top.image_top.stages[0][0].conv_pw.weight.grad, top.image_top.conv_head.weight.grad]


# --- arms ---------------------------------------------------------------------------------------


def test_every_top_arm_is_plain_with_only_its_variants_switches():
    plain = top_arm("plain")
    assert plain == TopArm()
    for name in TOP_ARMS:
        arm = top_arm(name)
        for field in dataclasses.fields(TopArm):
            expected = VARIANTS[name].get(field.name, getattr(plain, field.name))
            assert getattr(arm, field.name) == expected, (name, field.name)
        assert name == "plain" or arm != plain


@pytest.mark.parametrize("name", ["LACE-local + caption swaps", "ceiling (rendered swaps)"])
def test_arms_that_need_pixels_or_tokens_below_the_cut_are_refused(name):
    with pytest.raises(LaceInputError, match="below the cut") as refused:
        top_arm(name)
    assert repr(name) in str(refused.value)


@pytest.mark.parametrize("name, missing", [("caption negatives", "rule-made caption negatives"),
                                           ("LACE", "a concept dictionary editor"),
                                           ("LACE-local", "a local map editor")])
def test_an_arm_without_its_source_is_refused_naming_both(name, missing):
    sources = TopNegativeSources()
    sources.check(top_arm("plain"), "plain")  # plain needs nothing
    with pytest.raises(LaceInputError) as refused:
        sources.check(top_arm(name), name)
    assert name in str(refused.value) and missing in str(refused.value)


def test_local_caption_negatives_arm_needs_both_sources_and_names_both(map_editor):
    with pytest.raises(LaceInputError, match="rule-made caption negatives and a local map editor"):
        TopNegativeSources().check(top_arm("LACE-local + caption negatives"), "LACE-local + caption negatives")
    with pytest.raises(LaceInputError, match="rule-made caption negatives for this arm"):
        TopNegativeSources(map_editor=map_editor).check(top_arm("LACE-local + caption negatives"), "x")


# --- negatives of one batch ----------------------------------------------------------------------


def test_local_image_negatives_carry_gradient_into_the_image_top(top, map_editor):
    maps = object_maps(4)
    map_editor.reseed(0)
    negatives, valid = local_image_negatives(top, map_editor, maps, n_edits=2)
    assert negatives.shape == (4, 2, 8) and valid.shape == (4, 2) and valid[:, 0].all()
    torch.testing.assert_close(negatives[valid].norm(dim=-1), torch.ones(int(valid.sum())))
    top.zero_grad(set_to_none=True)
    negatives[valid].sum().backward()  # the negatives alone, no unedited pass
    assert all(grad is not None and grad.abs().sum() > 0 for grad in image_top_grads(top))
    assert top.text_top.layers[-1].output.dense.weight.grad is None
    top.zero_grad(set_to_none=True)


def test_maps_without_objects_give_invalid_slots_and_the_plain_loss(top, map_editor):
    noise = 0.05 * torch.randn(2, CUT_CHANNELS, *CUT_GRID, generator=torch.Generator().manual_seed(0))
    maps = torch.cat([object_maps(2), noise])  # two images with objects, two without
    tokens = token_states(4)
    sources = TopNegativeSources(map_editor=map_editor)
    with torch.no_grad():
        U, V = top.encode_image_states(maps), encode_captions(top, tokens, np.arange(4))
        negatives = batch_negatives(top, top_arm("LACE-local"), sources, maps, U, V, np.arange(4))
        assert negatives.caption_negatives is None
        assert negatives.image_valid[:2, 0].all() and not negatives.image_valid[2:].any()
        assert negatives.image_negatives[2:].abs().sum() == 0
        plain = lace_loss(U, V, top.logit_scale.exp())
        with_objects = lace_loss(U, V, top.logit_scale.exp(), image_negatives=negatives.image_negatives,
                                 image_valid=negatives.image_valid)
        assert with_objects > plain  # valid negatives add to the loss
        nothing = batch_negatives(top, top_arm("LACE-local"), sources, maps[2:], U[2:], V[2:], np.arange(2))
        assert not nothing.image_valid.any()
        masked = lace_loss(U[2:], V[2:], top.logit_scale.exp(), image_negatives=nothing.image_negatives,
                           image_valid=nothing.image_valid)
        torch.testing.assert_close(masked, lace_loss(U[2:], V[2:], top.logit_scale.exp()))


def test_caption_negatives_are_the_rule_rows_and_rows_without_one_are_invalid(top):
    tokens, rule_tokens = token_states(4), token_states(3, seed=1)
    rules = RuleStates(rule_tokens, row_of_caption=np.array([2, -1, 0, 1]))
    maps = object_maps(3)
    caption_rows = np.array([0, 1, 2])
    with torch.no_grad():
        U, V = top.encode_image_states(maps), encode_captions(top, tokens, caption_rows)
        negatives = batch_negatives(top, top_arm("caption negatives"), TopNegativeSources(rules=rules), maps, U, V,
                                    caption_rows)
        assert negatives.image_negatives is None
        assert negatives.caption_negatives.shape == (3, 1, 8)
        assert negatives.caption_valid[:, 0].tolist() == [True, False, True]
        expected = encode_captions(top, rule_tokens, [2, 0])  # the rule rows of captions 0 and 2
        torch.testing.assert_close(negatives.caption_negatives[[0, 2], 0], expected)
        assert negatives.caption_negatives[1].abs().sum() == 0
        assert not torch.allclose(expected[0], expected[1])


# --- training -------------------------------------------------------------------------------------


def tiny_split(n_images: int = 8) -> TopSplit:
    maps = object_maps(n_images, seed=2).numpy().astype(np.float16)
    owner = np.repeat(np.arange(n_images), 2)
    return TopSplit("train", maps, token_states(2 * n_images), np.arange(2 * n_images), owner)


def test_every_arm_trains_from_one_start_and_plain_ignores_the_sources(top, map_editor):
    split = tiny_split()
    sources = TopNegativeSources(map_editor=map_editor, rules=RuleStates(token_states(4, seed=1),
                                                                         np.array([0, -1, 1, 2] * 4)))
    runs = {}
    for name, arm, given in (("plain", "plain", None), ("plain with sources", "plain", sources),
                             ("LACE-local", "LACE-local", sources)):
        model = copy.deepcopy(top)
        runs[name] = (model, train_top(model, split, TINY, seed=0, arm=arm, sources=given))
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


# --- Flickr8k arms end to end --------------------------------------------------------------------

PAINTS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 170, 30), "yellow": (230, 220, 40)}
THINGS = ("dog", "ball", "car", "hat")


def make_coloured_flickr8k(root, n_images: int):
    """A Flickr8k folder (`tests.test_flickr8k.make_flickr8k`'s layout) of two coloured objects on grey,
    with two captions per image naming both objects and their colours."""
    (root / "images").mkdir(parents=True)
    rows, colours = [], list(PAINTS)
    for i in range(n_images):
        first, second = colours[i % 4], colours[(i + 1 + i // 4) % 4]
        thing, other = THINGS[i % 4], THINGS[(i + 2) % 4]
        image = Image.new("RGB", (64, 64), (128, 128, 128))
        draw = ImageDraw.Draw(image)
        draw.rectangle((4, 4, 28, 28), fill=PAINTS[first])
        draw.rectangle((36, 34, 60, 60), fill=PAINTS[second])
        name = f"{2000 + i * 7919}_{i:04x}.jpg"
        image.save(root / "images" / name)
        rows += [(name, f"a {first} {thing} and a {second} {other} ."),
                 (name, f"a {second} {other} next to a {first} {thing} .")]
    random.Random(0).shuffle(rows)
    with open(root / "captions.csv", "w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), *rows])
    return root


def test_run_arms_trains_saves_and_reuses_every_arm(tmp_path):
    from lace.study.flickr8k_top import run_protocol
    from lace.study.flickr8k_top_arms import run_arms

    data, cache, out = make_coloured_flickr8k(tmp_path / "flickr8k", 16), tmp_path / "cache", tmp_path / "out"
    run_protocol(str(data), str(cache), str(out), TINY, TINY, base_share=0.5, seeds=0, split="val",
                 finetune_on="rest", log=lambda _: None)
    arms = ["plain", "caption negatives", "LACE-local"]
    lines: list[str] = []
    result = run_arms(str(data), str(cache), str(out), arms, TINY, seeds=1, split="val", log=lines.append)
    assert set(result["summary"]) == {"base", *arms}
    written = json.loads((out / "arms-val.json").read_text())
    assert written["arms"] == arms and written["finetune_settings"] == dataclasses.asdict(TINY)
    assert "| LACE-local |" in (out / "arms-val.md").read_text()
    assert result["rule_negatives"]["with_a_negative"] > 0 and "local_editor" in result
    checkpoints = {arm: out / record["checkpoint"] for arm, (record,) in result["runs"].items() if arm != "base"}
    assert sorted(checkpoints) == sorted(arms)
    base = load_encoder("lace-towers", pretrained=str(out / "models" / "base.safetensors"))
    for arm, path in checkpoints.items():
        loaded = load_encoder("lace-towers", pretrained=str(path))
        changed = loaded.image_tower.blocks[-1].conv_pwl.weight
        assert not torch.equal(changed, base.image_tower.blocks[-1].conv_pwl.weight), arm
        assert result["runs"][arm][0]["train"]["steps"] == result["runs"]["plain"][0]["train"]["steps"]
    assert "image_negative_rows" in result["runs"]["LACE-local"][0]["train"]
    trained_at = {arm: path.stat().st_mtime_ns for arm, path in checkpoints.items()}
    assert sum("trained" in line for line in lines) == len(arms)

    lines.clear()
    again = run_arms(str(data), str(cache), str(out), arms, TINY, seeds=1, split="val", log=lines.append)
    assert not any("trained" in line for line in lines)
    assert {arm: path.stat().st_mtime_ns for arm, path in checkpoints.items()} == trained_at
    assert again["summary"] == result["summary"]


def test_lace_study_flickr8k_tops_trains_the_base_then_the_arms(tmp_path):
    from lace.cli import main

    data, out = make_coloured_flickr8k(tmp_path / "flickr8k", 16), tmp_path / "study"
    assert main(["study", "flickr8k", "--tops", "--data", str(data), "--out", str(out), "--arms", "plain",
                 "--seeds", "1"]) == 0
    assert (out / "models" / "base.safetensors").is_file() and (out / "features").is_dir()
    result = json.loads((out / "arms-val.json").read_text())
    assert result["arms"] == ["plain"] and result["summary"]["plain"]["i2t/R@1"]["n"] == 1
    assert (out / result["runs"]["plain"][0]["checkpoint"]).is_file()


def _summary(plain: tuple[float, float], local: tuple[float, float], r_at_1: float) -> dict:
    """Arms' summaries with swap_att = swap_obj = (mean, std) and both R@1 = r_at_1 for LACE-local (plain 0.5)."""
    def arm(mean_std, recall):
        swap = {"mean": mean_std[0], "std": mean_std[1], "n": 3}
        return {"sugarcrepe_style/swap_att": swap, "sugarcrepe_style/swap_obj": swap,
                "i2t/R@1": {"mean": recall, "std": 0.0, "n": 3}, "t2i/R@1": {"mean": recall, "std": 0.0, "n": 3}}

    return {"plain": arm(plain, 0.5), "LACE-local": arm(local, r_at_1)}


def test_target_checks_compare_the_gain_with_twice_the_seed_spread_and_retrieval_with_two_points():
    from lace.study.flickr8k_top_arms import target_checks

    met = target_checks(_summary((0.60, 0.01), (0.63, 0.01), r_at_1=0.485))
    assert [check["met"] for check in met] == [True, True, True, True]
    missed = target_checks(_summary((0.60, 0.02), (0.63, 0.01), r_at_1=0.47))
    assert [check["met"] for check in missed] == [False, False, False, False]
    assert "+3.0 points, spread 2.0" in missed[0]["measured"]
    assert target_checks({"plain": {}}) == []
