"""LACE-local's editor kept up with the tower: refits every `local.refresh_every` steps, a resumed run that
rebuilds the editor in use, the fidelity logged every `local.fidelity_every` steps, the editor saved as plain
tensors, and the settings refused."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.config import with_changes
from lace.data.readers import read_dataset
from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.experiment.variants import variant_config
from lace.local import LocalEditConfig, build_local_editor
from lace.local.config import LearntOperatorConfig
from lace.local.editor import fit_local_editor
from lace.local.state import editor_from_state, editor_state
from lace.local.transport import GaussianTransport
from lace.row_random import RowGenerators
from lace.train import TrainConfig, train
from lace.train.checkpoints import latest_checkpoint
from lace.train.config import train_config
from lace.train.loop import Trainer
from lace.train.sources import local_images as local_source
from tests.distributed_support import assert_same_weights
from tests.towers_support import ONE_PROCESS, TINY_FINETUNE, tiny_pairs

LOCAL = LocalEditConfig(layer="block1", locate_layer="block0", fit_images=24, refresh_every=2)
STEPS = 5


@pytest.fixture(scope="module")
def world(shapes_world) -> Path:
    """The session's 48-scene shapes world (read only)."""
    return shapes_world


def local_config(world: Path, output: Path, **changes) -> TrainConfig:
    """LACE-local on the tiny world, refitting every 2 of 5 steps, a metrics line per step."""
    config = train_config(model="lace-micro-32", data=str(world / "karpathy_coco.json"), output=str(output),
                         steps=STEPS, batch_size=8, lr=1e-3, warmup_steps=1, checkpoint_every=0, log_every=1,
                         device="cpu", vocabulary=str(world / "vocabulary.yaml"), local=LOCAL)
    return with_changes(variant_config(config, "LACE-local"), {**changes})


def metrics_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights_of(result) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in result.model.state_dict().items()}


@pytest.fixture(scope="module")
def whole(world, tmp_path_factory):
    """The uninterrupted run, with every fit of the editor and the editor each micro-batch edits with, in order."""
    events = []
    fit, image_pass = local_source.build_local_editor, local_source.LocalImagePass

    def fitted(*args, **kwargs):
        editor = fit(*args, **kwargs)
        events.append(("fit", editor))
        return editor

    class SeenPass(image_pass):
        def __init__(self, editor, *args):
            events.append(("edit", editor))
            super().__init__(editor, *args)

    run = tmp_path_factory.mktemp("whole") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_source, "build_local_editor", fitted)
        patch.setattr(local_source, "LocalImagePass", SeenPass)
        result = train(local_config(world, run), progress=False)
    return weights_of(result), events, run


@pytest.mark.slow
def test_a_refresh_replaces_the_editor_after_every_r_steps(whole):
    _, events, run = whole
    fits = [editor for kind, editor in events if kind == "fit"]
    assert len(fits) == 3  # before step 1, after step 2, after step 4 (the fifth and last step is no multiple)
    expected = [("fit", fits[0]), ("edit", fits[0]), ("edit", fits[0]), ("fit", fits[1]), ("edit", fits[1]),
                ("edit", fits[1]), ("fit", fits[2]), ("edit", fits[2])]
    assert len(events) == len(expected)
    assert all(kind == want_kind and editor is want for (kind, editor), (want_kind, want) in zip(events, expected))
    assert fits[0].reader.weight_.ne(fits[1].reader.weight_).any()  # refitted on the moved tower
    assert [m["local_editor_refreshes"] for m in metrics_of(run)] == [0, 1, 1, 2, 2]


@pytest.mark.slow
def test_a_resumed_run_rebuilds_the_refitted_editor_and_reaches_the_same_weights(whole, world, tmp_path):
    reference, _, whole_run = whole

    def kill_in_step_4(number, indices):
        if number == 3:  # the first micro-batch of step 4: after the step-3 checkpoint, one refit in
            raise KeyboardInterrupt

    config = local_config(world, tmp_path / "killed", checkpoint_every=3)
    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, on_batch=kill_in_step_4)
    assert latest_checkpoint(tmp_path / "killed").stem == "step_0000003"
    resumed = train(with_changes(config, {"resume": "latest"}), progress=False)
    assert resumed.steps == STEPS
    assert_same_weights(weights_of(resumed), reference)
    killed, uninterrupted = metrics_of(tmp_path / "killed"), metrics_of(whole_run)
    keys = ("step", "local_editor_refreshes", "image_negatives_valid_rows")
    assert [[m[k] for k in keys] for m in killed] == [[m[k] for k in keys] for m in uninterrupted]
    assert [m["loss"] for m in killed] == pytest.approx([m["loss"] for m in uninterrupted], abs=1e-6)


@pytest.mark.slow
def test_fidelity_is_logged_at_its_steps_and_leaves_training_alone(whole, world, tmp_path):
    reference, _, _ = whole
    local = replace(LOCAL, fidelity_every=2, fidelity_items=3)
    result = train(local_config(world, tmp_path / "run", local=local, log_every=10), progress=False)
    metrics = metrics_of(tmp_path / "run")
    assert [m["step"] for m in metrics] == [2, 4, 5]  # the fidelity steps log though log_every is 10
    for line in metrics[:2]:
        assert 0 < line["local_fidelity_valid"] <= 1
        assert -1 <= line["local_fidelity_direction"] <= 1 and -1 <= line["local_fidelity_control_direction"] <= 1
    assert not any(key.startswith("local_fidelity") for key in metrics[2])
    assert metrics[0]["local_fidelity_direction"] != metrics[1]["local_fidelity_direction"]  # the moved tower
    assert_same_weights(weights_of(result), reference)  # eval mode, no gradient, the random stream untouched
    assert result.model.training


@pytest.mark.slow
@pytest.mark.parametrize("operator", ["recolour", "learnt", "transport"])
def test_an_editor_saved_as_plain_tensors_makes_the_same_edits(world, operator):
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-32")
    data = read_dataset(world / "karpathy_coco.json", split="train")
    pixels = torch.stack([encoder.preprocess(data.load_image(i)) for i in range(24)])
    captions = [list(record.captions) for record in data.records[:24]]
    vocabulary = load_vocabulary(world / "vocabulary.yaml")
    if operator in ("recolour", "learnt"):  # the training default, and the learnt operator
        local = replace(LOCAL, operator=operator, learnt=LearntOperatorConfig(hidden=8, steps=5, positions_per_step=32))
        editor = build_local_editor(local, encoder.model, pixels, captions, encoder.preprocess.transforms[-1],
                                    vocabulary)
    else:  # Gaussian transport with covariances, few enough positions needed for 24 tiny images
        editor = fit_local_editor(encoder.model, pixels, captions, vocabulary, LOCAL.layer,
                                  transport=GaussianTransport(n_buckets=2, min_positions=2),
                                  locate_layer=LOCAL.locate_layer)
    buffer = io.BytesIO()
    torch.save(editor_state(editor), buffer)
    buffer.seek(0)
    same = editor_from_state(torch.load(buffer, weights_only=True))
    with torch.no_grad():
        made, again = (e.negatives(encoder.model, pixels[:8], 2, generator=RowGenerators(list(range(8))))
                       for e in (editor, same))
    assert made.valid.any()
    assert torch.equal(made.valid, again.valid) and torch.equal(made.embeddings, again.embeddings)


@pytest.mark.parametrize("field, value", [("refresh_every", -1), ("fidelity_every", -2), ("fidelity_items", 0)])
def test_bad_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(LaceInputError, match=f"local: field '{field}'"):
        train_config(local=replace(LOCAL, **{field: value})).validate()


@pytest.mark.slow
def test_fidelity_off_a_shapes_world_is_refused_naming_the_switch(world, tmp_path):
    elsewhere = tmp_path / "data"
    elsewhere.mkdir()
    (elsewhere / "karpathy_coco.json").write_text((world / "karpathy_coco.json").read_text())
    (elsewhere / "images").symlink_to(world / "images")
    config = local_config(world, tmp_path / "run", data=str(elsewhere / "karpathy_coco.json"),
                          local=replace(LOCAL, fidelity_every=2))
    with pytest.raises(LaceInputError, match="field 'data'.*local.fidelity_every"):
        train(config, progress=False)


def test_cached_tower_tops_refuse_refits_and_fidelity(tmp_path):
    from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
    from lace.encoders.towers.top import TowersTop

    torch.manual_seed(0)
    top = TowersTop(TowersDualEncoder(TowersConfig(embed_dim=8, head_hidden_dim=16, head_dropout=0.1)))
    base = variant_config(with_changes(TINY_FINETUNE.train_config(), {"model": "lace-towers", "vocabulary": "natural", "output": str(tmp_path / "run"), "checkpoint_every": 0}), "LACE-local")
    for field in ("refresh_every", "fidelity_every"):
        config = with_changes(base, {"local": replace(LocalEditConfig(), **{field: 2})})
        with pytest.raises(LaceInputError, match=f"local.{field}.*frozen"):
            Trainer(config, ONE_PROCESS, None, tiny_pairs(), False, None, local_editor=object(), encoder=top)
