"""A new negative source is one module and one `VARIANTS` entry: a toy source defined here, registered by name,
trains on every embed path it supports, and is refused on one it does not, with nothing changed in `lace.train`."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lace.config import with_changes
from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.errors import LaceInputError
from lace.experiment.variants import VARIANTS, variant_config
from lace.row_random import RowGenerators, normal
from lace.train import TensorPairs, train
from lace.train.checkpoints import latest_checkpoint, load_checkpoint
from lace.train.config import train_config
from lace.train.sources import SOURCES, register_source
from lace.train.sources.base import NegativeSource
from tests.test_train_features import feature_pairs
from tests.towers_support import TINY_FINETUNE, tiny_pairs

TOY_STREAM = 11


class NudgedImages(NegativeSource):
    """Two nudged copies of each image embedding, text->image negatives of its caption; the first row's are
    invalid, so the valid share of a batch of B rows is (B - 1) / B."""

    name = "toy nudges"
    paths = ("pixels", "features", "tops")
    steps_seen: ClassVar[list[int]] = []  # the steps its upkeep ran after, across the run

    def negatives(self, micro, negatives) -> None:
        generators = RowGenerators(micro.row_seeds(self.config.run.seed, TOY_STREAM))
        U = micro.U  # (B, d) with gradient
        noise = normal((U.shape[0], 2, U.shape[1]), generators, U.device)
        valid = torch.ones(U.shape[0], 2, dtype=torch.bool, device=U.device)
        valid[0] = False
        negatives.add_image_edits(F.normalize(U[:, None] + 0.3 * noise, dim=-1), valid,
                                  self.config.arm.edited_image_columns, None)

    def after_step(self, step: int) -> bool:
        NudgedImages.steps_seen.append(step)
        return False

    def state(self) -> dict:
        return {"toy_steps": torch.tensor(len(NudgedImages.steps_seen))}


class PixelsOnly(NegativeSource):
    name = "toy pixels only"
    paths = ("pixels",)


@pytest.fixture
def toy_arms(monkeypatch):
    """The toy sources registered and their arms in `VARIANTS`, for this test only."""
    registered = dict(SOURCES)
    for source in (NudgedImages, PixelsOnly):
        register_source(source)
        monkeypatch.setitem(VARIANTS, source.name, {"sources": (source.name,)})
    NudgedImages.steps_seen = []
    yield
    SOURCES.clear()
    SOURCES.update(registered)


def pixels_run(tmp_path, arm: str):
    generator = torch.Generator().manual_seed(0)
    pairs = TensorPairs(torch.rand(16, 3, 32, 32, generator=generator), [f"a photo number {i}" for i in range(16)])
    config = train_config(model="lace-micro-32", output=str(tmp_path / f"pixels-{arm}"), steps=3, batch_size=8,
                         lr=1e-3, warmup_steps=1, log_every=1, checkpoint_every=0, device="cpu", seed=1)
    return train(variant_config(config, arm), dataset=pairs, progress=False)


def features_run(tmp_path, arm: str):
    torch.manual_seed(1)
    encoder = TowersDualEncoder(TowersConfig(embed_dim=8, head_hidden_dim=16, head_dropout=0.1))
    config = train_config(model="lace-towers", output=str(tmp_path / f"features-{arm}"), device="cpu", seed=3,
                         lr=1e-2, steps=3, batch_size=4, warmup_steps=1, log_every=1, checkpoint_every=0)
    return train(variant_config(config, arm), dataset=feature_pairs(with_negatives=False), progress=False,
                 encoder=encoder)


def tops_run(tmp_path, arm: str, top):
    import copy

    config = with_changes(TINY_FINETUNE.train_config(), {"model": "lace-towers", "output": str(tmp_path / f"tops-{arm}"), "checkpoint_every": 0, "log_every": 1})
    return train(variant_config(config, arm), dataset=tiny_pairs(), progress=False, encoder=copy.deepcopy(top))


RUNS = {"pixels": pixels_run, "features": features_run, "tops": tops_run}


def run_on(path: str, tmp_path, arm: str, top):
    return RUNS[path](tmp_path, arm, top) if path == "tops" else RUNS[path](tmp_path, arm)


@pytest.mark.parametrize("path", NudgedImages.paths)
def test_a_toy_source_trains_on_every_path_it_supports(toy_arms, tmp_path, top, path):
    toy = run_on(path, tmp_path, "toy nudges", top)
    steps = toy.steps
    assert NudgedImages.steps_seen == list(range(1, steps + 1))  # its upkeep ran after every step
    lines = [line for line in toy.metrics_path.read_text().splitlines()]
    assert len(lines) == steps
    batch = 8 if path == "pixels" else 4
    assert toy.last_metrics["image_negatives_valid_rows"] == pytest.approx((batch - 1) / batch)
    assert toy.last_metrics["loss"] > toy.last_metrics["plain_loss"]  # its negatives are in the loss
    saved = load_checkpoint(latest_checkpoint(toy.run_dir), toy.run_dir).state
    assert int(saved["toy_steps"]) == steps  # its state is in the checkpoint
    plain = run_on(path, tmp_path, "plain", top)
    assert plain.last_metrics["image_negatives_valid_rows"] == 0.0
    differ = [key for key, value in toy.model.state_dict().items()
              if not torch.equal(value, plain.model.state_dict()[key])]
    assert differ  # the same run without the source trains to other weights


def test_a_source_on_a_path_it_does_not_support_is_refused_naming_the_field(toy_arms, tmp_path):
    with pytest.raises(LaceInputError, match=r"'sources'.*need pixels or tokens"):
        features_run(tmp_path, "toy pixels only")


def test_an_unknown_source_name_is_refused(tmp_path):
    pairs = TensorPairs(torch.rand(8, 3, 32, 32), ["a photo"] * 8)
    config = train_config(model="lace-micro-32", output=str(tmp_path / "run"), steps=1, batch_size=8, device="cpu",
                         sources=("no such source",))
    with pytest.raises(LaceInputError, match="sources.*no such source"):
        train(config, dataset=pairs, progress=False)


def test_a_taken_name_is_refused():
    class Impostor(NegativeSource):
        name = "counterfactual edits"

    with pytest.raises(ValueError, match="taken"):
        register_source(Impostor)
    assert SOURCES["counterfactual edits"] is not Impostor


def test_the_registry_is_where_the_built_in_sources_are(toy_arms):
    assert list(SOURCES)[:7] == ["counterfactual edits", "rule captions", "paired directions", "local image edits",
                                 "local caption swaps", "rendered ceiling", "pairs rows"]
    assert np.all([issubclass(source, NegativeSource) for source in SOURCES.values()])
