"""Data-parallel runs in tests: a free port, one training run in two gloo processes, and the tolerance
by which its weights may differ from one process's."""

import multiprocessing
import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from lace.config import with_changes
from lace.train import TrainConfig, train
from lace.train.checkpoints import latest_checkpoint

# Gathering, sharded rows and the gradient all-reduce only reorder float32 sums.
TOLERANCE = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, config: TrainConfig) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    train(config, progress=False)


def train_in_two_processes(config: TrainConfig, output: Path) -> dict[str, torch.Tensor]:
    """Train `config` in two gloo processes writing to `output`; return the last checkpoint's weights.

    The processes fork from multiprocessing's fork server, which imports this module (so torch and lace) once
    per test session: each run then starts at once instead of paying two fresh interpreters' imports, and
    nothing of the test process's own state (threads, loaded models) is forked with them."""
    multiprocessing.set_forkserver_preload([__name__])
    mp.start_processes(_worker, args=(2, free_port(), with_changes(config, {"output": str(output)})), nprocs=2, join=True,
                       start_method="forkserver")
    return load_file(str(latest_checkpoint(output).with_suffix(".safetensors")))


def assert_same_weights(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    """Every tensor of `reference` is in `weights`, equal within `TOLERANCE`."""
    assert weights.keys() == reference.keys()
    for key, value in weights.items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=TOLERANCE, msg=key)
