"""Row sources for pool-scale work: arrays, memory-mapped .npy files and tensors, read in chunks.

A pool of 600k x 512 embeddings is read block by block, so fitting and measuring
need memory proportional to the chunk, not to the pool. Every chunk is checked for
NaN/inf as it is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lace.errors import LaceInputError, input_error

RowSource = np.ndarray | Tensor | str | os.PathLike


class Rows:
    """A 2-D table of embeddings (N, d) read in row blocks. `name` is used in error messages."""

    def __init__(self, source: RowSource, name: str):
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            if not path.is_file():
                raise LaceInputError(f"{path}: file not found (expected a .npy array of embeddings)")
            try:
                source = np.load(path, mmap_mode="r")
            except ValueError as error:
                raise input_error(path, None, "a .npy array of embeddings", str(error)) from error
            name = str(path)
        if not isinstance(source, (np.ndarray, Tensor)):
            raise input_error(name, None, "an array or tensor of embeddings (N, d)", type(source).__name__)
        if source.ndim != 2:
            raise input_error(name, "shape", "a 2-D array (N, d)", tuple(source.shape))
        if not (source.dtype.is_floating_point if isinstance(source, Tensor) else np.issubdtype(source.dtype, np.floating)):
            raise input_error(name, "dtype", "floating-point embeddings", str(source.dtype))
        self.source = source
        self.name = name

    @property
    def n_rows(self) -> int:
        return int(self.source.shape[0])

    @property
    def dim(self) -> int:
        return int(self.source.shape[1])

    def read(self, start: int, stop: int, device: torch.device | str = "cpu") -> Tensor:
        """Rows [start, stop) as a float32 tensor (n, d), checked for NaN/inf."""
        block = self.source[start:stop]
        if isinstance(block, Tensor):
            block = block.detach().to(device=device, dtype=torch.float32)
        else:
            # a copy: memory-mapped blocks are read-only
            block = torch.from_numpy(np.array(block, dtype=np.float32)).to(device)
        check_finite(block, self.name, offset=start)
        return block

    def take(self, rows: np.ndarray, device: torch.device | str = "cpu") -> Tensor:
        """The given rows (sorted indices are fastest on a memory map) as float32 (n, d)."""
        if isinstance(self.source, Tensor):
            block = self.source[torch.as_tensor(rows, device=self.source.device)]
            block = block.detach().to(device=device, dtype=torch.float32)
        else:
            block = torch.from_numpy(np.ascontiguousarray(self.source[rows], dtype=np.float32)).to(device)
        check_finite(block, self.name)
        return block

    def chunks(self, chunk_size: int, device: torch.device | str = "cpu") -> Iterator[Tensor]:
        for start in range(0, self.n_rows, chunk_size):
            yield self.read(start, min(start + chunk_size, self.n_rows), device)


def check_finite(block: Tensor, name: str, offset: int = 0) -> None:
    """Raise `LaceInputError` naming the first row with NaN or inf."""
    finite = torch.isfinite(block).all(dim=1)
    if not bool(finite.all()):
        row = offset + int((~finite).nonzero()[0, 0])
        raise input_error(name, f"row {row}", "finite embedding values (no NaN or inf)", "NaN/inf")


def streaming_mean(rows: Rows, chunk_size: int = 65536) -> Tensor:
    """Mean row (d,) in float64 accumulation, one pass over the chunks."""
    if rows.n_rows == 0:
        raise input_error(rows.name, "shape", "at least one embedding row", (0, rows.dim))
    total = torch.zeros(rows.dim, dtype=torch.float64)
    for block in rows.chunks(chunk_size):
        total += block.double().sum(0).cpu()
    return (total / rows.n_rows).float()
