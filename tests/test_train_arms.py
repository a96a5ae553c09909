"""The training arms of the binding study: one switch each, the paired-caption formula, the ceiling's
rendered negative, and one process against two for LACE-local."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lace.config import config_to_dict, with_changes
from lace.data.world import render_scene
from lace.data.world.counterfactuals import colour_swapped
from lace.data.world.folder import read_scenes, read_world_config
from lace.data.world.render import object_coverage
from lace.edits import EditConfig
from lace.edits.records import EDIT_KINDS
from lace.experiment.variants import VARIANTS, variant_config
from lace.local import LocalEditConfig
from lace.train import TrainConfig, train
from lace.train.config import train_config
from lace.train.negatives import paired_caption_directions
from tests.distributed_support import assert_same_weights, train_in_two_processes


@pytest.fixture(scope="module")
def world(shapes_world):
    """The session's 48-scene shapes world (read only)."""
    return shapes_world


def _differences(config, other) -> set[str]:
    """The keys (as YAML names them) whose values differ."""
    written, other_written = config_to_dict(config), config_to_dict(other)
    return {name for name, value in written.items() if value != other_written[name]}


@pytest.mark.parametrize("name", [name for name in VARIANTS if name != "plain"])
def test_each_arm_changes_only_its_own_switches(name):
    plain = variant_config(train_config(vocabulary="world", edit=EditConfig(kinds=EDIT_KINDS)), "plain")  # the demo's editor
    changed = _differences(variant_config(plain, name), plain)
    assert changed and changed == set(VARIANTS[name])


def test_paired_caption_direction_moves_the_image_by_the_caption_change():
    U = torch.eye(4)[:2]  # (B=2, d=4)
    V = torch.eye(4)[[1, 2]]
    rule = torch.stack([torch.eye(4)[[2, 3]], torch.eye(4)[[3, 0]]])  # (B, R=2, d)
    made = paired_caption_directions(U, V, rule)
    assert made.shape == (2, 2, 4)
    by_hand = torch.tensor([0.5, -0.5, 0.5, 0.0]) / np.sqrt(0.75)  # normalise(e0 + e2 - e1)
    torch.testing.assert_close(made[0, 0], by_hand)
    torch.testing.assert_close(made.norm(dim=-1), torch.ones(2, 2))
    for b in range(2):
        for r in range(2):
            torch.testing.assert_close(made[b, r], F.normalize(U[b] + rule[b, r] - V[b], dim=0))


def test_ceiling_negative_differs_from_the_scene_only_by_the_colour_swap(world):
    config = read_world_config(world)
    scenes = list(read_scenes(world, "train").values())
    swapped_any = 0
    for scene in scenes:
        swapped = colour_swapped(scene, config)
        colours = [o["colour"] for o in scene["objects"]]
        if swapped is None:
            assert len(set(colours)) == 1
            continue
        i, j = [k for k, (a, b) in enumerate(zip(scene["objects"], swapped["objects"])) if a != b]
        assert (swapped["objects"][i]["colour"], swapped["objects"][j]["colour"]) == (colours[j], colours[i])
        for k, (a, b) in enumerate(zip(scene["objects"], swapped["objects"])):
            assert {key for key in a if a[key] != b[key]} == ({"colour"} if k in (i, j) else set())
        assert {key: v for key, v in scene.items() if key != "objects"} == \
               {key: v for key, v in swapped.items() if key != "objects"}
        original = np.asarray(render_scene(scene, config)).astype(int)
        rendered = np.asarray(render_scene(swapped, config)).astype(int)
        changed = (original != rendered).any(axis=-1)
        inside = (object_coverage(scene["objects"][i], config) + object_coverage(scene["objects"][j], config)) > 0
        assert changed.any() and not (changed & ~inside).any()
        swapped_any += 1
    assert swapped_any > len(scenes) // 2


def test_ceiling_arm_trains_on_the_world_with_a_valid_negative_per_scene(world, tmp_path):
    config = variant_config(train_config(model="lace-micro-32", data=str(world / "karpathy_coco.json"),
                                        output=str(tmp_path / "run"), steps=2, batch_size=8, lr=1e-3, warmup_steps=1,
                                        checkpoint_every=0, log_every=1, device="cpu"), "ceiling (rendered swaps)")
    result = train(config, progress=False)
    assert result.last_metrics["image_negatives_valid_rows"] > 0.5
    assert result.last_metrics["loss"] > result.last_metrics["plain_loss"]


def _local_config(world, tmp_path) -> TrainConfig:
    return variant_config(train_config(
        model="lace-micro-32", data=str(world / "karpathy_coco.json"), output=str(tmp_path / "one"), steps=3,
        batch_size=8, lr=1e-3, warmup_steps=1, checkpoint_every=0, log_every=1, device="cpu",
        vocabulary=str(world / "vocabulary.yaml"), local=LocalEditConfig(layer="block1", locate_layer="block0",
                                                            fit_images=24)), "LACE-local")


@pytest.mark.slow
def test_local_arm_one_process_and_two_processes_agree(world, tmp_path):
    config = _local_config(world, tmp_path)
    single = train(config, progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["image_negatives_valid_rows"] > 0 for m in metrics)  # the local negatives were there
    reference = single.model.state_dict()
    assert_same_weights(train_in_two_processes(config, tmp_path / "two"), reference)
    plain = train(with_changes(config, {"local_image_negatives": False, "output": str(tmp_path / "plain")}), progress=False)
    assert any(not torch.equal(plain.model.state_dict()[k], v) for k, v in reference.items())
