"""torch.distributed set-up from `torchrun`'s environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "cpu", timeout: float | None = None) -> DistributedContext:
    """Join the process group `torchrun` describes (gloo on CPU, nccl on CUDA); no-op alone.

    timeout: seconds a collective waits for the other processes before it fails (None: torch's default).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        torch_device = torch.device("cuda", local_rank)
        torch.cuda.set_device(torch_device)
    if world_size > 1 and not dist.is_initialized():
        wait = timedelta(seconds=timeout) if timeout is not None else None
        store = _restart_store(rank, world_size, wait)
        dist.init_process_group(backend="nccl" if torch_device.type == "cuda" else "gloo", timeout=wait,
                                **({"store": store, "rank": rank, "world_size": world_size} if store else {}))
    return DistributedContext(rank, world_size, local_rank, torch_device)


def _restart_store(rank: int, world_size: int, timeout: timedelta | None):
    """After `torchrun --max-restarts` restarted the workers: the launcher's store under a prefix of this
    attempt, else None (the default set-up). The launcher keeps one store for all attempts, and a process
    group joined without a prefix would read the addresses the first attempt's processes published there."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timeout or timedelta(minutes=30))
    return dist.PrefixStore(f"lace/attempt_{restart}", store)


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
