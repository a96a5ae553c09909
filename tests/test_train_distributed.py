"""Two gloo processes on the CPU train to the same weights as one process with the same global batch."""

import os
import socket
from dataclasses import replace
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from lace.encoders import load_encoder
from lace.train import TrainConfig, train
from lace.train.checkpoints import latest_checkpoint
from tests.conftest import make_images

WORLD_VOCABULARY = str(Path(__file__).resolve().parents[1] / "src/lace/data/world/vocabulary.yaml")
# Gathering, sharded rows and the gradient all-reduce only reorder float32 sums.
TOLERANCE = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, config: TrainConfig) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    train(config, progress=False)


def test_two_processes_match_one(tmp_path):
    names = make_images(tmp_path / "images", 16)
    colours = ["red", "green", "blue", "yellow"]
    (tmp_path / "pairs.csv").write_text("filepath,caption\n" + "".join(
        f"images/{n},a {colours[i % 4]} square left of a {'circle' if i % 2 else 'star'}\n" for i, n in enumerate(names)))
    config = TrainConfig(model="lace-micro-32", data=str(tmp_path / "pairs.csv"), output=str(tmp_path / "one"),
                         steps=3, batch_size=8, lr=1e-3, warmup_steps=1, checkpoint_every=0, device="cpu",
                         caption_negatives=True, vocabulary=WORLD_VOCABULARY)
    single = train(config, progress=False)
    two = replace(config, output=str(tmp_path / "two"))
    mp.spawn(_worker, args=(2, _free_port(), two), nprocs=2, join=True)
    weights = load_file(str(latest_checkpoint(tmp_path / "two").with_suffix(".safetensors")))
    reference = single.model.state_dict()
    assert weights.keys() == reference.keys()
    for key, value in weights.items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=TOLERANCE, msg=key)
    torch.manual_seed(config.seed)  # the initial weights, to check that training moved them
    fresh = load_encoder("lace-micro-32", None).state_dict()
    moved = sum(not torch.equal(fresh[k], weights[k]) for k in weights if k in fresh)
    assert moved > 10
