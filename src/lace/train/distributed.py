"""What the trainer needs from torch.distributed beyond joining the group (`lace.distributed`).

Every helper is the identity (or a no-op) in a single process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from lace.distributed import DistributedContext


class _AllGather(torch.autograd.Function):
    """(n, ...) per process -> (W, n, ...) stacked; the gradient of each piece goes back to its owner."""

    @staticmethod
    def forward(ctx, local: Tensor) -> Tensor:
        pieces = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, local.contiguous())
        return torch.stack(pieces)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        # Every process holds gradients for every piece (its loss uses all of them): sum them,
        # then keep this process's own piece.
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[dist.get_rank()]


def gather_with_grad(local: Tensor, context: DistributedContext) -> tuple[Tensor, int]:
    """All processes' rows (G, d), with gradient to each owner, and this process's first row.

    Processes may hold different numbers of rows (a skipped image): rows are padded to
    the largest count for the collective and the padding is cut off again.
    """
    if not context.enabled:
        return local, 0
    counts = all_gather_counts(local.shape[0], context)
    largest = max(counts)
    padded = torch.cat([local, local.new_zeros(largest - local.shape[0], *local.shape[1:])]) if local.shape[0] < largest else local
    pieces = _AllGather.apply(padded)  # (W, largest, ...)
    gathered = torch.cat([piece[:count] for piece, count in zip(pieces, counts)])
    return gathered, sum(counts[: context.rank])


def all_gather_counts(count: int, context: DistributedContext) -> list[int]:
    counts = [torch.zeros(1, dtype=torch.long, device=context.device) for _ in range(context.world_size)]
    dist.all_gather(counts, torch.tensor([count], dtype=torch.long, device=context.device))
    return [int(c.item()) for c in counts]


def sum_over_processes(values: list[float], context: DistributedContext) -> list[float]:
    """Elementwise sum of a list of numbers over all processes."""
    if not context.enabled:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=context.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def barrier(context: DistributedContext) -> None:
    if context.enabled:
        dist.barrier()
