"""Data-parallel runs in tests: a free port, a fork server to start processes from, a function or one training
run in two gloo processes, plain SGD for exactness checks, and the tolerance by which two processes' weights may
differ from one process's."""

import multiprocessing
import os
import socket
import time
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


def forkserver() -> multiprocessing.context.ForkServerContext:
    """multiprocessing's fork-server context. Its server imports this module (so torch and lace's trainer) and
    the open_clip adapter once per test session: a process forked from it starts at once instead of paying a
    fresh interpreter's imports (about 7 CPU seconds), and nothing of the test process's own state (threads,
    loaded models) is forked with it. It inherits the server's environment, not the test's."""
    multiprocessing.set_forkserver_preload([__name__, "lace.encoders.open_clip_encoder"])
    return multiprocessing.get_context("forkserver")


def become_rank(rank: int, world_size: int, port: int) -> None:
    """Give this process the environment torchrun gives worker `rank` of `world_size` on one machine (what lace
    reads to join the job), and one thread."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def _as_rank(rank: int, world_size: int, port: int, function, args: tuple) -> None:
    become_rank(rank, world_size, port)
    function(*args)


def in_two_processes(function, *args, timeout: float = 300) -> None:
    """`function(*args)` in two processes forked from `forkserver()`, as ranks 0 and 1 of a job in the environment
    torchrun gives its workers (what lace reads); raises when either process fails, or is still running after
    `timeout` seconds (a collective that waits for ever). `function`: module-level."""
    forkserver()
    processes = mp.start_processes(_as_rank, args=(2, free_port(), function, args), nprocs=2, join=False,
                                   start_method="forkserver")
    deadline = time.monotonic() + timeout
    while not processes.join(timeout=1):
        if time.monotonic() > deadline:
            for process in processes.processes:
                process.kill()
            raise AssertionError(f"{function.__name__} still running in two processes after {timeout} s")


def _train(config: TrainConfig, build_optimizer) -> None:
    if build_optimizer is not None:
        import lace.train.loop

        lace.train.loop.build_optimizer = build_optimizer
    train(config, progress=False)


def train_in_two_processes(config: TrainConfig, output: Path, build_optimizer=None) -> dict[str, torch.Tensor]:
    """Train `config` in two gloo processes (`in_two_processes`) writing to `output`; return the last checkpoint's
    weights. `build_optimizer`: a module-level stand-in for `lace.train.loop.build_optimizer` in both processes
    (None: lace's own), such as `plain_sgd`."""
    in_two_processes(_train, with_changes(config, {"output": str(output)}), build_optimizer)
    return load_file(str(latest_checkpoint(output).with_suffix(".safetensors")))


def plain_sgd(encoder, lr, weight_decay, betas, eps, scaled=frozenset(), lr_scale=1.0) -> torch.optim.Optimizer:
    """Stands in for `build_optimizer` in exactness checks: the step is lr times the gradient (no momentum, no
    weight decay), so the weights show any error in the gradient's scale, which AdamW would divide out."""
    return torch.optim.SGD([p for p in encoder.parameters() if p.requires_grad], lr=lr)


def assert_same_weights(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    """Every tensor of `reference` is in `weights`, equal within `TOLERANCE`."""
    assert weights.keys() == reference.keys()
    for key, value in weights.items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=TOLERANCE, msg=key)
