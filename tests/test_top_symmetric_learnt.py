"""Issue 35's two fixes on the tower tops: artefact-symmetric counterparts of the map edits, made by the same operator
at the same objects and run through the top in the edits' own pass, and the learnt operator fitted on the tower's
maps at the cut before and after a colour map of photographs (the ridge operator when its network is the ridge map;
saved in checkpoints, so a resumed run trains what the uninterrupted one trains); both trained by the one trainer."""

from __future__ import annotations

import copy
import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import lace.concepts
from lace.config import with_changes
from lace.encoders import load_encoder
from lace.encoders.towers import fresh_token_states
from lace.errors import LaceInputError
from lace.experiment.variants import VARIANTS, variant_config
from lace.local.config import LearntOperatorConfig
from lace.local.cut_recolour import CutPhotographs, fit_cut_operator, photo_prototypes
from lace.local.editor import LocalImageEditor
from lace.local.learnt import LearntRecolour
from lace.local.maps import CUT_LAYER, MapEditor, fit_map_editor, maps_of, regions_of
from lace.local.objects import find_objects
from lace.local.recolour import RecolourRegression, colour_map_examples
from lace.local.symmetric import counterpart_steps
from lace.row_random import RowGenerators
from lace.study.config import TOP_ARMS, TopsStudyConfig
from lace.study.flickr8k_top_arms import arm_train_config
from lace.train import train
from lace.train.checkpoints import latest_checkpoint
from lace.train.data import LOCAL_STREAM, TopPairs
from tests.distributed_support import assert_same_weights
from tests.towers_support import (
    CUT_CHANNELS,
    CUT_GRID,
    PAINTS,
    TINY_FINETUNE,
    TINY_HEADS,
    make_coloured_flickr8k,
    token_states,
    top_trainer,
)

COLOURS = ["red", "green", "blue", "yellow"]
FAST = LearntOperatorConfig(hidden=16, steps=20, rows_per_pair=64, positions_per_step=64)
PATCH = 4  # pixels per position of the cut's 7 x 7 grid


def local_arm(**knobs) -> str:
    """The name of the chosen pairs arm (pairs + column + real-image negative) with these local knobs, looked up by
    its switches in `VARIANTS` (so it holds whatever the arm is called)."""
    base = VARIANTS["LACE-local pairs + real-image negative"]
    return next(name for name, changes in VARIANTS.items() if changes == {**base, "local": knobs})


ROUND_TRIP, NO_OP = local_arm(symmetric="round_trip"), local_arm(symmetric="no_op")
LEARNT, LEARNT_ROUND_TRIP = local_arm(operator="learnt"), local_arm(operator="learnt", symmetric="round_trip")


def photographs(n_images: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 3, 28, 28) grainy grey pictures in [0, 1] with two squares of two of the four colours (their CSS
    prototypes), each on 2 x 2 positions of the cut, and their (N, 2) colour indices."""
    generator = torch.Generator().manual_seed(seed)
    prototypes = photo_prototypes(COLOURS)
    raw = torch.full((n_images, 3, 7 * PATCH, 7 * PATCH), 0.5)
    colours = torch.stack([torch.randperm(len(COLOURS), generator=generator)[:2] for _ in range(n_images)])
    for row in range(n_images):
        for k in range(2):
            top = PATCH * (k * 4 + int(torch.randint(2, (1,), generator=generator)))
            left = PATCH * int(torch.randint(6, (1,), generator=generator))
            raw[row, :, top:top + 2 * PATCH, left:left + 2 * PATCH] = prototypes[colours[row, k], :, None, None]
    grain = 0.05 * torch.randn(raw.shape, generator=generator)  # a photograph's texture
    return (raw + grain).clamp(0, 1), colours


def tiny_lower() -> nn.Module:
    """A frozen tower below the cut: (n, 3, 28, 28) in [0, 1] -> (n, 192, 7, 7), a 4 x 4 patch convolution and a
    tanh, seeded."""
    generator = torch.Generator().manual_seed(3)
    conv = nn.Conv2d(3, CUT_CHANNELS, PATCH, stride=PATCH)
    with torch.no_grad():
        conv.weight.copy_(0.2 * torch.randn(conv.weight.shape, generator=generator))
        conv.bias.copy_(0.5 * torch.randn(conv.bias.shape, generator=generator))
    return nn.Sequential(conv, nn.Tanh()).eval().requires_grad_(False)


def mentions_of(colours: torch.Tensor) -> torch.Tensor:
    mentions = torch.zeros(len(colours), len(COLOURS), dtype=torch.bool)
    mentions[torch.arange(len(colours))[:, None], colours] = True
    return mentions


@pytest.fixture(scope="module")
def learnt_world():
    """Photographs, the lower tower, their maps at the cut and the map editor with the learnt operator fitted on
    them (the reader on the maps, the operator on the photographs' maps before and after each colour map)."""
    raw, colours = photographs(32, seed=0)
    lower = tiny_lower()
    maps = lower(raw)
    cut = CutPhotographs(raw, lower, photo_prototypes(COLOURS))
    editor = fit_map_editor(maps, mentions_of(colours), COLOURS, seed=0,
                            operator_fit=partial(fit_cut_operator, cut, config=FAST, seed=0))
    return raw, colours, lower, maps, cut, editor


@pytest.fixture(scope="module")
def learnt_editor(learnt_world) -> MapEditor:
    return learnt_world[-1]


def test_the_learnt_map_operator_is_the_ridge_operator_when_its_network_is_the_ridge_map(learnt_world):
    raw, _, lower, maps, cut, editor = learnt_world
    learnt = editor.editor.transport
    assert isinstance(learnt, LearntRecolour)
    # its ridge is the ridge operator fitted on the same self-supervision: the maps before and after each colour map
    original = cut.features_of(raw)
    torch.testing.assert_close(original, regions_of(maps))
    examples = colour_map_examples(cut.features_of, raw, original, find_objects(editor.editor.reader, original),
                                   CUT_GRID, cut.prototypes, learnt.window, learnt.min_coverage)
    ridge = RecolourRegression(learnt.window, learnt.ridge, learnt.min_coverage).fit_examples(examples, len(COLOURS))
    assert sorted(ridge.weights_) == sorted(learnt.ridge_.weights_) and len(ridge.weights_) == 12  # every pair
    assert all(torch.equal(ridge.weights_[pair], learnt.ridge_.weights_[pair]) for pair in ridge.weights_)
    ridge_editor = MapEditor(LocalImageEditor(CUT_LAYER, editor.editor.reader, ridge, COLOURS, seed=0), CUT_GRID)
    test_maps, seeds = lower(photographs(8, seed=1)[0]), list(range(8))
    made_ridge = ridge_editor.edit(test_maps, 2, generator=RowGenerators(seeds))
    assert made_ridge.valid.any()
    made_learnt = editor.edit(test_maps, 2, generator=RowGenerators(seeds))
    assert not torch.equal(made_learnt.maps, made_ridge.maps)  # the fitted network moves the edits
    network = learnt.network_
    try:
        learnt.network_ = network.ridge  # the network replaced by the ridge map
        replaced = editor.edit(test_maps, 2, generator=RowGenerators(seeds))
    finally:
        learnt.network_ = network
    assert torch.equal(replaced.valid, made_ridge.valid) and torch.equal(replaced.maps, made_ridge.maps)


def test_a_grey_or_unnamed_colour_is_never_a_source_and_its_pairs_never_move(learnt_world):
    """Photographs' commonest colours are grey: a grey-preserving map cannot repaint them, so their pairs are never
    learnt, and the network (never trained on them) adds nothing to them either."""
    raw, colours, _, maps, _, _ = learnt_world
    names = ["red", "green", "gray", "colorful"]  # blue shown as gray, yellow as colorful
    cut = CutPhotographs(raw, tiny_lower(), photo_prototypes(names))
    assert photo_prototypes(names)[3].isnan().all()
    editor = fit_map_editor(maps, mentions_of(colours), names, seed=0,
                            operator_fit=partial(fit_cut_operator, cut, config=FAST, seed=0))
    learnt = editor.editor.transport
    assert {source for source, _ in learnt.ridge_.weights_} == {0, 1}
    assert {target for _, target in learnt.ridge_.weights_} == {0, 1, 2}  # gray a target, colorful none
    regions = regions_of(maps[:4])
    coverage = torch.ones(4, regions.shape[1])
    for source, target, moves in ((2, 0, False), (3, 0, False), (0, 3, False), (0, 2, True)):
        step = learnt.move(regions, CUT_GRID, coverage, torch.full((4,), source), torch.full((4,), target))
        assert bool(step.abs().sum() > 0) == moves, (source, target)
    with pytest.raises(ValueError, match="none was found"):
        fit_cut_operator(CutPhotographs(raw, tiny_lower(), photo_prototypes(["gray", "white", "black", "dark"])),
                         editor.editor.reader, FAST)


@pytest.mark.parametrize("kind", ["round_trip", "no_op"])
def test_a_symmetric_counterpart_moves_the_same_objects_by_the_same_operator(learnt_editor, kind):
    bare = 0.5 + 0.05 * torch.randn(2, 3, 7 * PATCH, 7 * PATCH, generator=torch.Generator().manual_seed(0))
    maps, seeds = tiny_lower()(torch.cat([photographs(6, seed=2)[0], bare])), list(range(8))  # 2 without objects
    plain = learnt_editor.edit(maps, 2, generator=RowGenerators(seeds))
    made = learnt_editor.edit(maps, 2, generator=RowGenerators(seeds), symmetric=kind)
    assert torch.equal(made.maps, plain.maps) and torch.equal(made.valid, plain.valid)  # the same edits
    assert made.valid[:6].any() and not made.valid[6:].any() and made.counterparts.shape == made.maps.shape
    regions = regions_of(maps)
    slots = learnt_editor.editor.steps(regions, CUT_GRID, 2, made.objects, RowGenerators(seeds))
    expected = maps_of(regions[:, None] + counterpart_steps(kind, learnt_editor.editor.transport, regions, CUT_GRID,
                                                            made.objects, slots), CUT_GRID)
    torch.testing.assert_close(made.counterparts, expected)
    moved = (made.counterparts - maps[:, None]).flatten(2).norm(dim=2)  # (B, M)
    edit_size = (made.maps - maps[:, None]).flatten(2).norm(dim=2)
    if kind == "round_trip":  # the edit and its way back: near the real map, not on it (the operator's artefact)
        assert (moved[made.valid] > 0).all() and (moved[made.valid] < edit_size[made.valid]).all()
    else:  # a move from a colour to itself: the ridge learns no identity pair and the network adds nothing to it
        assert moved.abs().max() == 0
    assert moved[~made.valid].abs().max() == 0


def coloured_top_pairs(top, maps: torch.Tensor, colours: torch.Tensor) -> TopPairs:
    """The maps with two captions each naming both colours, their texts and the text tower below the cut (what the
    pairs arms' described captions need)."""
    texts = [caption for a, b in colours.tolist() for caption in
             (f"a {COLOURS[a]} dog next to a {COLOURS[b]} ball", f"a {COLOURS[b]} ball and a {COLOURS[a]} dog")]
    return TopPairs(maps.numpy().astype(np.float16), token_states(len(texts)), np.arange(len(texts)),
                    np.repeat(np.arange(len(maps)), 2), caption_texts=texts,
                    state_encoder=partial(fresh_token_states, top.encoder))


class CountingTop:
    """Records the size of every call of the top's image pass."""

    def __init__(self, top):
        self.top, self.calls = top, []
        self.original = top.encode_image_states

    def __enter__(self):
        def counted(maps):
            self.calls.append(len(maps))
            return self.original(maps)
        self.top.encode_image_states = counted
        return self

    def __exit__(self, *exc):
        del self.top.encode_image_states


def test_the_symmetric_counterparts_run_in_the_edits_pass_of_the_top_and_stand_in_for_the_real_maps(
        top, learnt_world, tmp_path):
    _, colours, _, maps, _, editor = learnt_world
    pairs = coloured_top_pairs(top, maps[:8], colours[:8])
    trainer = top_trainer(top, LEARNT_ROUND_TRIP, tmp_path, pairs, local_editor=editor)
    batch = pairs.collate([pairs[sample] for sample in trainer.order.micro_batch(0)])
    top.eval()
    with torch.no_grad(), CountingTop(top) as counting:
        micro, negatives = trainer.embed(batch, 0)
    (edited,) = negatives.edited
    valid, count = edited.valid, int(edited.valid.sum())
    assert count > 0 and counting.calls == [len(batch.indices) + 2 * count]  # real, edits, counterparts: one pass
    with torch.no_grad():
        made = editor.edit(batch.maps, 2, generator=RowGenerators(micro.row_seeds(trainer.config.run.seed, LOCAL_STREAM)),
                           symmetric="round_trip")
        torch.testing.assert_close(edited.counterparts[valid], top.encode_image_states(made.counterparts[valid]))
        torch.testing.assert_close(edited.embeddings[valid], top.encode_image_states(made.maps[valid]))
        real = top.encode_image_states(batch.maps)
    first = valid.float().argmax(dim=1)
    for row in range(len(valid)):  # U: the counterpart of the row's first valid slot, the real map without one
        expected = edited.counterparts[row, first[row]] if valid[row].any() else real[row]
        torch.testing.assert_close(micro.U[row], expected)


def test_the_tops_refuse_the_nuisance_kind_and_an_editor_of_the_other_operator(top, learnt_editor, map_editor,
                                                                                 tmp_path):
    nuisance = local_arm(symmetric="nuisance")
    with pytest.raises(LaceInputError, match="field 'local.symmetric'.*shapes world's palette"):
        top_trainer(top, nuisance, tmp_path, local_editor=map_editor)
    with pytest.raises(LaceInputError, match="field 'local.operator': expected a MapEditor fitted with the learnt"):
        top_trainer(top, LEARNT, tmp_path, local_editor=map_editor)
    with pytest.raises(LaceInputError, match="field 'local.operator': expected learnt"):
        top_trainer(top, ROUND_TRIP, tmp_path, local_editor=learnt_editor)
    refresh = _config(tmp_path / "refresh", LEARNT, local={"refresh_every": 2})
    with pytest.raises(LaceInputError, match="refresh_every.*learnt or not"):
        train(refresh, dataset=coloured_top_pairs(top, learnt_editor_maps(), torch.zeros(8, 2, dtype=torch.long)),
              progress=False, encoder=copy.deepcopy(top), local_editor=learnt_editor)


def learnt_editor_maps() -> torch.Tensor:
    return tiny_lower()(photographs(8, seed=4)[0])


def _config(output, arm: str, local: dict | None = None, **changes):
    config = variant_config(with_changes(TINY_FINETUNE.train_config(), {
        "model": "lace-towers", "vocabulary": "natural", "output": str(output), "checkpoint_every": 0, "log_every": 1,
        "steps": 4, "epochs": None, "batch_size": 4}), arm)
    return with_changes(config, {"local": {"learnt": FAST, **(local or {})}, **changes})


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["plain", LEARNT, LEARNT_ROUND_TRIP])
def test_a_resumed_tops_run_trains_what_the_whole_run_trains_with_or_without_the_learnt_operator(top, learnt_world, arm,
                                                                                      tmp_path):
    """4 steps against 2 + a resume of 2 (the heads' dropout reads the random stream, which the resumed run restarts
    from the checkpoint's state); the resumed run is given an editor with another network, and edits with the one
    its checkpoint holds."""
    _, colours, _, maps, _, editor = learnt_world
    pairs = partial(coloured_top_pairs, maps=maps[:8], colours=colours[:8])
    model = copy.deepcopy(top)
    whole = train(_config(tmp_path / "whole", arm), dataset=pairs(model), progress=False, encoder=model,
                  local_editor=editor)
    assert whole.steps == 4
    lines = [json.loads(line) for line in whole.metrics_path.read_text().splitlines()]
    assert all(line["image_negatives_valid_rows"] > 0 for line in lines) if arm != "plain" else True
    reference = {key: value.detach().clone() for key, value in model.state_dict().items()}
    assert not all(torch.equal(reference[key], value) for key, value in top.state_dict().items())

    def stop_in_step_3(number, indices):
        if number == 2:
            raise KeyboardInterrupt

    halves, config = copy.deepcopy(top), _config(tmp_path / "halves", arm, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(config, dataset=pairs(halves), progress=False, encoder=halves, local_editor=editor, on_batch=stop_in_step_3)
    checkpoint = latest_checkpoint(tmp_path / "halves")
    assert checkpoint.stem == "step_0000002"
    other = MapEditor.from_state(editor.state_dict())  # the same editor with another network
    with torch.no_grad():
        other.editor.transport.network_.out.bias.add_(0.1)
    resumed_model = copy.deepcopy(top)
    resumed = train(with_changes(config, {"resume": "latest"}), dataset=pairs(resumed_model), progress=False,
                    encoder=resumed_model, local_editor=other)
    assert resumed.steps == 4
    assert_same_weights({key: value.detach() for key, value in resumed_model.state_dict().items()}, reference)


# --- the tops study ----------------------------------------------------------------------------------


def test_the_tops_study_takes_the_symmetric_and_learnt_arms_from_the_command_line(tmp_path, monkeypatch):
    import lace.study.flickr8k_top_arms as arms_module
    from lace.cli import main

    ran = []
    monkeypatch.setattr(arms_module, "run_tops_study", lambda config: ran.append(config) or {"split": config.split})
    data = make_coloured_flickr8k(tmp_path / "flickr8k", 4)
    arms = (ROUND_TRIP, NO_OP, LEARNT, LEARNT_ROUND_TRIP)
    assert main(["study", "flickr8k", "--tops", "--data", str(data), "--out", str(tmp_path / "study"),
                 "--arms", ",".join(arms), "--local-fit-images", "8", "--finetune-local-learnt-steps", "5"]) == 0
    (config,) = ran
    assert config.arms == arms and set(arms) <= set(TOP_ARMS)
    made = {arm: arm_train_config(config, arm, seed=0, n_images=4, output=tmp_path).negatives.local for arm in arms}
    assert [(local.symmetric, local.operator) for local in made.values()] == [
        ("round_trip", "recolour"), ("no_op", "recolour"), ("none", "learnt"), ("round_trip", "learnt")]
    assert all(local.fit_images == 8 and local.learnt.steps == 5 for local in made.values())


def four_colour_vocabulary(folder) -> str:
    """The natural vocabulary with the four colours the tiny Flickr8k paints (a colour map per ordered pair of them:
    12 passes of the tower below the cut instead of 13 per found colour)."""
    natural = yaml.safe_load((Path(lace.concepts.__file__).parent / "vocabularies" / "natural.yaml").read_text())
    natural["attributes"]["colour"] = list(PAINTS)
    path = folder / "four-colours.yaml"
    path.write_text(yaml.safe_dump(natural, sort_keys=False))
    return str(path)


@pytest.mark.slow
def test_the_tops_study_trains_the_symmetric_and_learnt_arms_end_to_end(tmp_path):
    """On a tiny coloured Flickr8k through the real towers: the round trip on the Gaussian map editor and on the learnt
    one, which the study fits on the first training photographs at the cut, each with its figures."""
    from lace.experiment.protocol import Run
    from lace.study.flickr8k_top_arms import run_tops_study

    data, out = make_coloured_flickr8k(tmp_path / "flickr8k", 16), tmp_path / "out"
    arms = (ROUND_TRIP, LEARNT_ROUND_TRIP)
    finetune = with_changes(TINY_FINETUNE, {"local": {"fit_images": 8, "learnt": FAST}})
    result = run_tops_study(TopsStudyConfig(data=str(data), out=str(out), base=TINY_HEADS, finetune=finetune, seeds=1,
                                            items_per_kind=8, progress=False, arms=arms,
                                            vocabulary=four_colour_vocabulary(tmp_path)), log=lambda _: None)
    assert set(result["summary"]) == {"base", *arms}
    assert result["local_editor"]["operator"] == "transport"
    learnt = result["local_editor_learnt"]
    assert learnt["operator"] == "learnt" and learnt["learnt_operator"]["fit_images"] == 8
    assert 0 < learnt["learnt_operator"]["pairs_learnt"] and learnt["learnt_operator"]["learnt_reconstruction"] < 1
    stages = {arm: json.loads((out / "stages" / f"{Run(arm, 0).stage('train')}.json").read_text())["result"]
              for arm in arms}
    assert all(stage["image_negative_rows"] > 0 and "pair_rows" in stage for stage in stages.values())
    weights = {arm: load_encoder("lace-towers", pretrained=str(out / stage["checkpoint"])).image_tower.blocks[-1]
               .conv_pwl.weight for arm, stage in stages.items()}
    assert not torch.equal(*weights.values())  # the two operators trained the top differently
