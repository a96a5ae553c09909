"""Artefact-symmetric counterparts (`lace.local.symmetric`, `local.symmetric`): the real image's stand-in is made
through the same cut, operator and upper pass as the edit it is compared with, and the arm trains alike in one
process and two, and after a resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lace.concepts.vocabulary import vocabulary_from_dict
from lace.config import with_changes
from lace.data.world import (
    WorldConfig,
    caption_scene,
    colour_shape_combinations,
    render_scene,
    sample_scene,
)
from lace.data.world.config import PALETTE
from lace.data.world.scene import sample_rng
from lace.errors import LaceInputError
from lace.experiment.variants import ROLES, VARIANTS, variant_config
from lace.local import LocalEditConfig
from lace.local import symmetric as symmetric_module
from lace.local.editor import fit_recolour_editor
from lace.local.recolour import halo
from lace.local.symmetric import fit_shade_regression, real_stand_ins, symmetric_negatives
from lace.local.towers import ImageTowerSplit
from lace.row_random import RowGenerators
from lace.train import TrainConfig, train
from lace.train.checkpoints import latest_checkpoint
from lace.train.config import train_config
from tests.distributed_support import assert_same_weights, train_in_two_processes

SYMMETRIC_ARMS = {"round_trip": "LACE-local symmetric pairs (round trip)",
                  "nuisance": "LACE-local symmetric pairs (nuisance)", "no_op": "LACE-local symmetric pairs (no-op)"}
CHOSEN = "LACE-local pairs + real-image negative"


@pytest.fixture(scope="module")
def fitted(resnet):
    """48 rendered scenes, the recolour editor fitted on them at layer1, the shade regression and the prototypes."""
    config = WorldConfig(n_images=64, image_size=32, clutter=2)
    combinations = colour_shape_combinations(config)
    scenes = [sample_scene(sample_rng(0, "train", i, 0), config, "train", combinations, i) for i in range(48)]
    captions = [[caption_scene(scene, sample_rng(0, "train", i, 1), "coco", config)] for i, scene in enumerate(scenes)]
    pixels = torch.from_numpy(np.stack([np.asarray(render_scene(s, config)) for s in scenes])).permute(0, 3, 1, 2)
    pixels = pixels.float() / 255.0
    vocabulary = vocabulary_from_dict({"name": "w", "objects": list(config.shapes),
                                       "attributes": {"colour": list(config.colours)}, "relations": []})
    prototypes = torch.tensor([PALETTE[name] for name in config.colours]).float() / 255.0
    normalise = resnet.preprocess.transforms[-1]
    editor = fit_recolour_editor(resnet.model, pixels, normalise, captions, vocabulary, "layer1", prototypes,
                                 locate_layer="layer1")
    shade = fit_shade_regression(resnet.model, "layer1", pixels, normalise, editor.reader, prototypes, "layer1")
    return editor, shade, normalise(pixels[:12])


class TowerCalls:
    """Records every lower and upper pass of `ImageTowerSplit` as `lace.local.symmetric` runs them: the layer, and
    the maps that enter the upper layers."""

    def __init__(self, patch: pytest.MonkeyPatch):
        self.lower, self.upper, self.inside = [], [], False
        split = symmetric_module.ImageTowerSplit
        lower, upper = split.lower, split.upper

        def recorded_lower(tower, pixels):
            self.lower.append(tower.layer)
            return lower(tower, pixels)

        def recorded_upper(tower, maps, reference_rows=None):
            if reference_rows is not None or not self.inside:  # not upper's own inner call
                self.upper.append((tower.layer, maps.detach().clone()))
            self.inside = True
            try:
                return upper(tower, maps, reference_rows)
            finally:
                self.inside = False

        patch.setattr(split, "lower", recorded_lower)
        patch.setattr(split, "upper", recorded_upper)


def _grid(resnet, editor, pixels) -> tuple[int, int]:
    split = ImageTowerSplit(resnet.model, editor.layer)
    with torch.no_grad():
        split.lower(pixels)
    return split.grid


def _recorded(editor, resnet, pixels, kind, shade, n_edits=2):
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        calls = TowerCalls(patch)
        made = symmetric_negatives(editor, resnet.model, pixels, n_edits, kind, shade,
                                   RowGenerators(list(range(len(pixels)))))
    return made, calls


@pytest.mark.parametrize("kind", ["round_trip", "nuisance", "no_op"])
def test_the_counterpart_enters_the_same_upper_pass_at_the_same_layer_as_its_edit(resnet, fitted, kind):
    editor, shade, pixels = fitted
    made, calls = _recorded(editor, resnet, pixels, kind, shade)
    batch, n_edits = len(pixels), 2
    # one lower pass, one upper pass, both at the editor's layer; the upper pass holds the real maps, the edits
    # and the counterparts together (so BatchNorm normalises them alike)
    assert calls.lower == [editor.layer]
    assert [layer for layer, _ in calls.upper] == [editor.layer]
    maps = calls.upper[0][1]
    assert maps.shape[0] == batch * (1 + 2 * n_edits)
    real = maps[:batch].flatten(1)
    edited = maps[batch:batch * (1 + n_edits)].reshape(n_edits, batch, -1)
    partner = maps[batch * (1 + n_edits):].reshape(n_edits, batch, -1)
    valid = made.negatives.valid.T  # (M, B)
    assert valid.any()
    moved = (partner - real[None]).norm(dim=2)  # (M, B): how far each counterpart is from its real map
    assert (moved[~valid] == 0).all()  # no counterpart where the slot has no edit
    # the edits are the editor's own, and the real maps' embeddings the encoder's
    with torch.no_grad():
        plain = editor.negatives(resnet.model, pixels, n_edits, generator=RowGenerators(list(range(batch))))
    torch.testing.assert_close(made.negatives.embeddings, plain.embeddings)
    torch.testing.assert_close(made.negatives.original, resnet.encode_images(pixels))
    if kind == "no_op":  # the identity move: the real map itself, through the same pass
        assert (moved == 0).all()
        torch.testing.assert_close(made.counterparts, made.negatives.original[:, None].expand_as(made.counterparts))
    else:
        assert (moved[valid] > 0).all()
    if kind == "round_trip":  # edit then edit back: closer to the real map than the edit is
        away = (edited - real[None]).norm(dim=2)
        assert (moved[valid] < away[valid]).float().mean() > 0.5


def test_the_round_trip_moves_back_from_the_edited_map_at_the_same_objects(resnet, fitted):
    editor, shade, pixels = fitted
    made, calls = _recorded(editor, resnet, pixels, "round_trip", shade, n_edits=1)
    maps, batch = calls.upper[0][1], len(pixels)  # (B (1 + 2M), P, C): a ResNet has no prefix positions
    real, edited, partner = maps[:batch], maps[batch:2 * batch], maps[2 * batch:]
    grid = _grid(resnet, editor, pixels)
    objects = made.negatives.objects
    a, b = objects.concept[:, 0], objects.concept[:, 1]
    back = (editor.transport.move(edited, grid, objects.coverage[:, 0], b, a)
            + editor.transport.move(edited, grid, objects.coverage[:, 1], a, b))  # the reverse of the swap
    valid = made.negatives.valid[:, 0, None, None]
    assert valid.any()
    torch.testing.assert_close(partner, torch.where(valid, edited + back, real))  # no counterpart without an edit
    near = halo(objects.coverage.amax(dim=1), grid) > editor.transport.min_coverage
    assert ((partner - real).norm(dim=-1)[~near] == 0).all()


def test_the_round_trip_of_a_transplant_brings_its_object_back_from_the_new_concept(resnet, fitted):
    editor, shade, pixels = fitted
    made, calls = _recorded(editor, resnet, pixels, "round_trip", shade, n_edits=2)
    maps, batch = calls.upper[0][1], len(pixels)  # real, swap edits, transplant edits, swap and transplant partners
    real, edited, partner = maps[:batch], maps[2 * batch:3 * batch], maps[4 * batch:]
    objects, changes = made.negatives.objects, made.negatives.changes[:, 1]  # slot 1: a transplant on object 0
    assert made.negatives.kinds[1] == "transplant" and torch.equal(changes[:, 0], objects.concept[:, 0])
    back = editor.transport.move(edited, _grid(resnet, editor, pixels), objects.coverage[:, 0], changes[:, 1],
                                 changes[:, 0])
    valid = made.negatives.valid[:, 1, None, None]
    assert valid.any()
    torch.testing.assert_close(partner, torch.where(valid, edited + back, real))


def test_the_nuisance_moves_the_swapped_objects_to_their_own_colours_lighter_shade(resnet, fitted):
    editor, shade, pixels = fitted
    made, calls = _recorded(editor, resnet, pixels, "nuisance", shade, n_edits=1)
    maps, batch = calls.upper[0][1], len(pixels)
    real, partner = maps[:batch], maps[2 * batch:]
    objects, valid = made.negatives.objects, made.negatives.valid[:, 0, None, None]
    grid = _grid(resnet, editor, pixels)
    groups = len(editor.concept_names)
    lighter = (shade.move(real, grid, objects.coverage[:, 0], objects.concept[:, 0], objects.concept[:, 0] + groups)
               + shade.move(real, grid, objects.coverage[:, 1], objects.concept[:, 1], objects.concept[:, 1] + groups))
    assert valid.any() and lighter.abs().sum() > 0
    torch.testing.assert_close(partner, real + lighter * valid)
    assert shade.n_concepts_ == 2 * groups  # the group's colours, then their lighter shades: pairs (a, G + a) only
    assert shade.weights_ and all(target == source + groups for source, target in shade.weights_)


def test_a_row_stands_in_with_its_first_valid_slots_counterpart():
    original = torch.randn(3, 4)
    counterparts = torch.randn(3, 2, 4)
    valid = torch.tensor([[True, True], [False, True], [False, False]])
    made = real_stand_ins(original, counterparts, valid)
    torch.testing.assert_close(made, torch.stack([counterparts[0, 0], counterparts[1, 1], original[2]]))


@pytest.mark.parametrize("changes", [{"symmetric": "both"}, {"symmetric": "nuisance", "operator": "mean_shift"},
                                     {"symmetric": "nuisance", "refresh_every": 2}])
def test_impossible_symmetric_settings_are_refused_naming_the_field(changes):
    with pytest.raises(LaceInputError, match="symmetric"):
        LocalEditConfig(**changes).validate()


def test_the_symmetric_arms_are_the_chosen_pairs_arm_with_one_knob_and_play_the_best_role():
    for kind, name in SYMMETRIC_ARMS.items():
        config = variant_config(train_config(), name)
        chosen = variant_config(train_config(), CHOSEN)
        assert config == with_changes(chosen, {"local": {"symmetric": kind}})
        assert name in ROLES["best"]
    twin = "LACE-local symmetric pairs (round trip) + caption negatives"
    assert VARIANTS[twin] == {**VARIANTS[SYMMETRIC_ARMS["round_trip"]], "caption_negatives": True}


# ---- through the trainer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(shapes_world) -> Path:
    """The session's 48-scene shapes world (read only)."""
    return shapes_world


def _config(world: Path, output: Path, name: str, **changes) -> TrainConfig:
    return with_changes(variant_config(train_config(
        model="lace-micro-32", data=str(world / "karpathy_coco.json"), output=str(output), steps=3, batch_size=8,
        lr=1e-3, warmup_steps=1, checkpoint_every=0, log_every=1, device="cpu", vocabulary=str(world / "vocabulary.yaml"),
        local=LocalEditConfig(layer="block1", locate_layer="block0", fit_images=24)), name), changes)


def _weights(result) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in result.model.state_dict().items()}


@pytest.fixture(scope="module")
def round_trip(world, tmp_path_factory) -> tuple[TrainConfig, dict[str, torch.Tensor], list[dict]]:
    """The round-trip arm trained in one process: its config, final weights and metric lines (the two tests below
    compare with the same run)."""
    output = tmp_path_factory.mktemp("round-trip") / "one"
    config = _config(world, output, SYMMETRIC_ARMS["round_trip"])
    weights = _weights(train(config, progress=False))
    return config, weights, [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_no_op_arm_trains_as_the_chosen_arm_and_the_round_trip_arm_does_not(world, round_trip, tmp_path):
    chosen = _weights(train(_config(world, tmp_path / "chosen", CHOSEN), progress=False))
    no_op = _weights(train(_config(world, tmp_path / "no-op", SYMMETRIC_ARMS["no_op"]), progress=False))
    for key, value in no_op.items():  # the same images reach the loss (the upper pass only holds more rows)
        torch.testing.assert_close(value, chosen[key], rtol=0, atol=1e-4, msg=key)
    _, round_trip_weights, metrics = round_trip
    assert metrics[-1]["pair_rows_valid"] > 0
    assert any((value - chosen[key]).abs().max() > 1e-4 for key, value in round_trip_weights.items())


@pytest.mark.slow
def test_the_round_trip_arm_in_one_process_and_two_processes_agree(round_trip, tmp_path):
    config, single, metrics = round_trip
    assert all(m["pair_rows_valid"] > 0 for m in metrics)
    assert_same_weights(train_in_two_processes(config, tmp_path / "two"), single)


@pytest.mark.slow
def test_a_resumed_nuisance_arm_reaches_the_uninterrupted_weights(world, tmp_path):
    steps = 4
    whole = _weights(train(_config(world, tmp_path / "whole", SYMMETRIC_ARMS["nuisance"], steps=steps),
                           progress=False))

    def kill_in_step_3(number, indices):
        if number == 2:
            raise KeyboardInterrupt

    config = _config(world, tmp_path / "killed", SYMMETRIC_ARMS["nuisance"], steps=steps, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, on_batch=kill_in_step_3)
    assert latest_checkpoint(tmp_path / "killed").stem == "step_0000002"
    assert_same_weights(_weights(train(with_changes(config, {"resume": "latest"}), progress=False)), whole)


def test_cached_tower_tops_refuse_the_nuisance_counterparts_only(world, tmp_path):
    """The nuisance shade needs pixels and the shapes world's palette; the round trip and the no-op are made on the
    cached maps (tests/test_top_symmetric_learnt.py)."""
    from lace.train.sources.local_images import LocalImageEdits

    class Path_:
        name, where = "tops", "tower tops"

    def run_of(kind: str):
        class Run_:
            config = _config(world, tmp_path, SYMMETRIC_ARMS[kind])
        return Run_()

    with pytest.raises(LaceInputError, match="local.symmetric.*shapes world's palette"):
        LocalImageEdits.check(run_of("nuisance"), Path_(), {"local_editor": object()})
    for kind in ("round_trip", "no_op"):
        LocalImageEdits.check(run_of(kind), Path_(), {"local_editor": object()})
