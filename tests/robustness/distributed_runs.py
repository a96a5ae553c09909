"""Training runs of `test_distributed_exact`, started by `python -m torch.distributed.run` in every process.

Usage: distributed_runs.py CONFIGS_JSON, a JSON list of `TrainConfig` dicts, trained one after another
with plain SGD (no momentum, no weight decay), so that the weights show any error in the gradient's scale.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import lace.train.loop
from lace.config import config_from_dict
from lace.train import TrainConfig, train


def plain_sgd(encoder, lr, weight_decay, betas, eps, scaled=frozenset(), lr_scale=1.0) -> torch.optim.Optimizer:
    """Stands in for `build_optimizer`: the step is lr times the gradient, nothing rescales it."""
    return torch.optim.SGD([p for p in encoder.parameters() if p.requires_grad], lr=lr)


def main(path: str) -> None:
    torch.set_num_threads(1)
    lace.train.loop.build_optimizer = plain_sgd
    # one process group for all runs: a group created again after one was destroyed can read the old
    # group's addresses from torchrun's store and fail to connect
    dist.init_process_group("gloo")
    try:
        for values in json.loads(Path(path).read_text()):
            train(config_from_dict(TrainConfig, values), progress=False)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
