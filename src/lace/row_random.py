"""Random draws of the editor: from one generator for a whole batch, or one generator per row.

With one `torch.Generator` a batch's draws depend on which rows share the batch. `RowGenerators`
gives each row its own generator (seeded per sample by the caller), so a row's edits are the same
whether it is edited alone, in a batch of one process, or in a shard of a batch split over
processes. Every draw of the editor goes through `uniform` and `normal`, in a fixed order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class RowGenerators:
    """One generator per row of a batch, seeded from `seeds` (B,) on `device`."""

    def __init__(self, seeds: Sequence[int], device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.generators = [torch.Generator(self.device).manual_seed(int(seed)) for seed in seeds]

    def __len__(self) -> int:
        return len(self.generators)

    def draw(self, sample, shape: tuple[int, ...], batch_dim: int, device: torch.device) -> Tensor:
        """`shape` with B at `batch_dim`; row b's slice drawn by `sample(row_shape, generator)` from row b's generator."""
        if shape[batch_dim] != len(self.generators):
            raise ValueError(f"RowGenerators: a batch of {shape[batch_dim]} rows, but {len(self.generators)} seeds")
        row_shape = shape[:batch_dim] + shape[batch_dim + 1:]
        rows = [sample(row_shape, generator) for generator in self.generators]
        if not rows:
            return torch.empty(shape, device=device)
        return _moved(torch.stack(rows, dim=batch_dim), device)


Randomness = torch.Generator | RowGenerators | None


def _draw(sample, shape: tuple[int, ...], generator: Randomness, device: torch.device, batch_dim: int) -> Tensor:
    """`sample` (torch.rand or torch.randn) of `shape`, made on the generator's device, moved to `device`."""
    if isinstance(generator, RowGenerators):
        return generator.draw(lambda s, g: sample(s, generator=g, device=generator.device), shape, batch_dim, device)
    source_device = generator.device if generator is not None else device
    return _moved(sample(shape, generator=generator, device=source_device), device)


def _moved(drawn: Tensor, device: torch.device) -> Tensor:
    """`drawn` on `device`; a fresh host tensor is copied without stalling the device's queue (a GPU step's editor
    draws every step), a device tensor comes back to the host as a blocking copy (its values must be there)."""
    return drawn.to(device, non_blocking=drawn.device.type == "cpu")


def uniform(shape: tuple[int, ...], generator: Randomness, device: torch.device, batch_dim: int = 0) -> Tensor:
    """U[0, 1) draws of `shape` (batch along `batch_dim`), made on the generator's device, moved to `device`."""
    return _draw(torch.rand, shape, generator, device, batch_dim)


def normal(shape: tuple[int, ...], generator: Randomness, device: torch.device, batch_dim: int = 0) -> Tensor:
    """Standard normal draws of `shape` (batch along `batch_dim`), made on the generator's device, moved to `device`."""
    return _draw(torch.randn, shape, generator, device, batch_dim)
