"""The learnt recolouring operator (`local.operator learnt`): it is the ridge operator when its network is the
ridge map, its fit is seeded and learns, it is chosen by flags and variants, a resumed run and two processes train
what one uninterrupted process trains with it."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lace.concepts.vocabulary import load_vocabulary
from lace.config import add_config_arguments, config_from_args, with_changes
from lace.data.readers import read_dataset
from lace.encoders import load_encoder
from lace.errors import LaceInputError
from lace.experiment.variants import VARIANTS, variant_config
from lace.local import LocalEditConfig, build_local_editor
from lace.local.config import LearntOperatorConfig
from lace.local.editor import LocalImageEditor
from lace.local.learnt import LearntRecolour, RecolourNetwork
from lace.row_random import RowGenerators
from lace.train import TrainConfig, train
from lace.train.checkpoints import latest_checkpoint
from lace.train.config import train_config
from tests.distributed_support import assert_same_weights, train_in_two_processes

FAST = LearntOperatorConfig(hidden=16, steps=20, rows_per_pair=64, positions_per_step=64)
LEARNT = LocalEditConfig(layer="block1", locate_layer="block0", fit_images=24, operator="learnt", learnt=FAST)
ARM = "LACE-local learnt pairs + real-image negative"


@pytest.fixture(scope="module")
def world(shapes_world) -> Path:
    """The session's 48-scene shapes world (read only)."""
    return shapes_world


@pytest.fixture(scope="module")
def fitted(world):
    """A tiny encoder, 24 training images with their captions, and the learnt and ridge editors fitted on them."""
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-32").eval()
    data = read_dataset(world / "karpathy_coco.json", split="train")
    pixels = torch.stack([encoder.preprocess(data.load_image(i)) for i in range(24)])
    captions = [list(record.captions) for record in data.records[:24]]
    vocabulary = load_vocabulary(world / "vocabulary.yaml")

    def fit(config: LocalEditConfig) -> LocalImageEditor:
        return build_local_editor(config, encoder.model, pixels, captions, encoder.preprocess.transforms[-1],
                                  vocabulary)

    return encoder, pixels, fit, fit(LEARNT), fit(replace(LEARNT, operator="recolour"))


def _negatives(editor: LocalImageEditor, encoder, pixels):
    with torch.no_grad():
        return editor.negatives(encoder.model, pixels[:8], 2, generator=RowGenerators(list(range(8))))


def test_with_the_ridge_map_as_its_network_the_learnt_operator_is_the_ridge_operator(fitted):
    encoder, pixels, _, learnt_editor, ridge_editor = fitted
    learnt, ridge = learnt_editor.transport, ridge_editor.transport
    assert isinstance(learnt, LearntRecolour)
    # the ridge inside the learnt operator is the ridge operator, fitted on the same self-supervision
    assert learnt.ridge_.weights_.keys() == ridge.weights_.keys()
    assert all(torch.equal(learnt.ridge_.weights_[pair], ridge.weights_[pair]) for pair in ridge.weights_)
    made_ridge = _negatives(ridge_editor, encoder, pixels)
    assert made_ridge.valid.any()
    made_learnt = _negatives(learnt_editor, encoder, pixels)
    assert not torch.equal(made_learnt.embeddings, made_ridge.embeddings)  # the fitted residual moves the edits
    network = learnt.network_
    try:
        learnt.network_ = network.ridge  # the network replaced by the ridge map
        replaced = _negatives(learnt_editor, encoder, pixels)
    finally:
        learnt.network_ = network
    assert torch.equal(replaced.valid, made_ridge.valid) and torch.equal(replaced.embeddings, made_ridge.embeddings)


def test_the_fit_is_seeded_and_leaves_the_random_stream_alone(fitted):
    _, _, fit, learnt_editor, _ = fitted
    state = torch.random.get_rng_state()
    again = fit(LEARNT).transport
    assert torch.equal(torch.random.get_rng_state(), state)
    first = learnt_editor.transport.network_.state_dict()
    assert all(torch.equal(value, first[name]) for name, value in again.network_.state_dict().items())
    other = LearntRecolour(FAST, seed=1)
    other.n_concepts_ = again.n_concepts_
    other.window = again.window
    stacked = again.network_.ridge.weights
    rows = 128
    inputs = torch.randn(rows, stacked.shape[1] - 1, generator=torch.Generator().manual_seed(0))
    pair = torch.full((rows,), 1, dtype=torch.long)
    change = torch.randn(rows, stacked.shape[2], generator=torch.Generator().manual_seed(1))
    assert not torch.equal(other._train(stacked, pair, inputs, change).out.weight, again.network_.out.weight)


def test_the_network_learns_a_change_the_ridge_cannot():
    """On positions whose change is a non-linear function of the centre, the fitted network's error falls well
    below the (here zero) ridge map's, with and without the adversarial term."""
    generator = torch.Generator().manual_seed(0)
    channels, window, n_concepts = 4, 3, 3
    inputs = torch.randn(2048, window * window * channels, generator=generator)
    centre = inputs[:, 4 * channels:5 * channels]
    pair = torch.randint(n_concepts * n_concepts, (2048,), generator=generator)
    change = centre.abs() * (1 + (pair % n_concepts))[:, None]  # depends on the target concept
    stacked = torch.zeros(n_concepts * n_concepts, inputs.shape[1] + 1, channels)
    for weight in (0.0, 0.1):
        operator = LearntRecolour(LearntOperatorConfig(hidden=32, steps=300, adversarial_weight=weight, lr=3e-3,
                                                       positions_per_step=256), window=window)
        operator.n_concepts_ = n_concepts
        network = operator._train(stacked, pair, inputs, change)
        assert isinstance(network, RecolourNetwork)
        figures = operator.fit_figures_
        assert figures["ridge_reconstruction"] == pytest.approx(1.0)
        assert figures["learnt_reconstruction"] < 0.2
        assert (figures["critic_loss"] > 0) == (weight > 0)


def test_flags_and_the_variant_choose_the_learnt_operator():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TrainConfig)
    args = parser.parse_args(["--local-operator", "learnt", "--local-learnt-hidden", "32",
                              "--local-learnt-adversarial-weight", "0.25", "--local-learnt-steps", "50"])
    config = config_from_args(TrainConfig, args)
    assert config.negatives.local.operator == "learnt"
    assert config.negatives.local.learnt == LearntOperatorConfig(hidden=32, adversarial_weight=0.25, steps=50)
    arm = variant_config(train_config(vocabulary="world"), ARM)
    assert arm.negatives.local.operator == "learnt" and arm.arm.edited_rows_real_image_negative
    assert {key: value for key, value in VARIANTS[ARM].items() if key != "local"} == VARIANTS[
        "LACE-local pairs + real-image negative"]


@pytest.mark.parametrize("field, value", [("hidden", 0), ("steps", 0), ("adversarial_weight", -0.1), ("lr", 0.0)])
def test_bad_knobs_are_refused_naming_the_field(field, value):
    with pytest.raises(LaceInputError, match=f"learnt.{field}"):
        LocalEditConfig(operator="learnt", learnt=LearntOperatorConfig(**{field: value})).validate()


def _train_config(world: Path, output: Path, **changes) -> TrainConfig:
    config = train_config(model="lace-micro-32", data=str(world / "karpathy_coco.json"), output=str(output),
                          steps=4, batch_size=8, lr=1e-3, warmup_steps=1, checkpoint_every=0, log_every=1,
                          device="cpu", vocabulary=str(world / "vocabulary.yaml"), local=LEARNT)
    return with_changes(variant_config(config, ARM), changes)


@pytest.mark.slow
def test_a_resumed_run_with_the_learnt_operator_reaches_the_same_weights(world, tmp_path):
    """4 steps against 2 + a resume of 2, the editor refitted after step 2 (so the checkpoint holds the network)."""
    local = replace(LEARNT, refresh_every=2)
    whole = train(_train_config(world, tmp_path / "whole", local=local), progress=False)
    reference = {key: value.detach().clone() for key, value in whole.model.state_dict().items()}

    def stop_in_step_3(number, indices):
        if number == 2:
            raise KeyboardInterrupt

    config = _train_config(world, tmp_path / "halves", local=local, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, on_batch=stop_in_step_3)
    assert latest_checkpoint(tmp_path / "halves").stem == "step_0000002"
    resumed = train(with_changes(config, {"resume": "latest"}), progress=False)
    assert resumed.steps == 4
    assert_same_weights({key: value.detach() for key, value in resumed.model.state_dict().items()}, reference)
    lines = [json.loads(line) for line in (tmp_path / "halves" / "metrics.jsonl").read_text().splitlines()]
    assert [line["local_editor_refreshes"] for line in lines] == [0, 1, 1, 2]


@pytest.mark.slow
def test_the_learnt_operator_arm_one_process_and_two_processes_agree(world, tmp_path):
    config = _train_config(world, tmp_path / "one", steps=3)
    single = train(config, progress=False)
    lines = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert all(line["image_negatives_valid_rows"] > 0 for line in lines)  # the learnt operator's edits were there
    assert_same_weights(train_in_two_processes(config, tmp_path / "two"), single.model.state_dict())
