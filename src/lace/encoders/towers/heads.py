"""Trainable projection heads from a tower's features into the shared space."""

from __future__ import annotations

import torch


class ProjectionHead(torch.nn.Module):
    """Linear map (`hidden_dim=0`) or MLP `Linear -> GELU -> Dropout -> Linear`.

    (N, in_dim) tower features -> (N, out_dim) raw, unnormalised embeddings.
    """

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 2048, dropout: float = 0.5):
        super().__init__()
        if hidden_dim < 0 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"expected hidden_dim >= 0 and 0 <= dropout < 1, got {hidden_dim}, {dropout}")
        if hidden_dim == 0:
            self.layers = torch.nn.Sequential(torch.nn.Linear(in_dim, out_dim))
        else:
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(in_dim, hidden_dim),
                torch.nn.GELU(),
                torch.nn.Dropout(dropout),
                torch.nn.Linear(hidden_dim, out_dim),
            )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)
