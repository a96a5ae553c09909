"""Two gloo processes on the CPU train to the same weights as one process with the same global batch."""

from pathlib import Path

import pytest
import torch

from lace.encoders import load_encoder
from lace.train import train
from lace.train.config import train_config
from tests.conftest import make_images
from tests.distributed_support import assert_same_weights, train_in_two_processes

WORLD_VOCABULARY = str(Path(__file__).resolve().parents[1] / "src/lace/data/world/vocabulary.yaml")

@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    names = make_images(tmp_path / "images", 16)
    colours = ["red", "green", "blue", "yellow"]
    (tmp_path / "pairs.csv").write_text("filepath,caption\n" + "".join(
        f"images/{n},a {colours[i % 4]} square left of a {'circle' if i % 2 else 'star'}\n" for i, n in enumerate(names)))
    config = train_config(model="lace-micro-32", data=str(tmp_path / "pairs.csv"), output=str(tmp_path / "one"),
                         steps=3, batch_size=8, lr=1e-3, warmup_steps=1, checkpoint_every=0, device="cpu",
                         caption_negatives=True, vocabulary=WORLD_VOCABULARY)
    single = train(config, progress=False)
    weights = train_in_two_processes(config, tmp_path / "two")
    assert_same_weights(weights, single.model.state_dict())
    torch.manual_seed(config.run.seed)  # the initial weights, to check that training moved them
    fresh = load_encoder("lace-micro-32", None).state_dict()
    moved = sum(not torch.equal(fresh[k], weights[k]) for k in weights if k in fresh)
    assert moved > 10
