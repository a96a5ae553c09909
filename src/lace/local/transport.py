"""What a position would look like with another attribute: Gaussian optimal transport at L.

A concept's position features are not a constant plus a concept vector: colour interacts with
shape, texture and how much of the position the object covers, so adding a mean difference
(the naive edit) moves every position the same way and misses most of the real change. Here the
features of positions that show concept a, in a bucket of coverage, are modelled as a Gaussian,
likewise for concept b, and a position is moved by the optimal-transport (Monge) map between the
two Gaussians, `x -> mu_b + A_ab (x - mu_a)` with `A_ab = S_a^-1/2 (S_a^1/2 S_b S_a^1/2)^1/2 S_a^-1/2`:
the least-moving map that turns one distribution into the other, so a position keeps where it
sat within its concept's spread. With `window=3` a position is described by its 3x3 neighbourhood
of features (the receptive fields above L see neighbours), and the map's output is the centre.

Everything is fitted on training features with coverage from the position reader (no scene graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _padded_map(features: Tensor, grid: tuple[int, int], window: int) -> Tensor:
    """(B, P, C) features on a (H, W) grid -> (B, H + 2 pad, W + 2 pad, C) zero-padded, channels last."""
    pad = window // 2
    return F.pad(features.reshape(features.shape[0], *grid, features.shape[-1]), (0, 0, pad, pad, pad, pad))


def neighbourhoods(features: Tensor, grid: tuple[int, int], window: int) -> Tensor:
    """(B, P, C) features on a (H, W) grid -> (B, P, window^2 C) zero-padded neighbourhoods, ordered by place in
    the window (row-major), then channel: the centre position's own features are the middle C."""
    if window == 1:
        return features
    batch, _, channels = features.shape
    height, width = grid
    maps = _padded_map(features, grid, window)
    shifted = [maps[:, down : down + height, across : across + width] for down in range(window)
               for across in range(window)]  # window^2 x (B, H, W, C)
    return torch.stack(shifted, dim=3).reshape(batch, height * width, window * window * channels)


def neighbourhood_rows(features: Tensor, grid: tuple[int, int], window: int, rows: Tensor,
                       positions: Tensor) -> Tensor:
    """The rows `neighbourhoods(features, grid, window)[rows, positions]` (K, window^2 C), gathered for the K
    (image, position) pairs only: (B, P, C) features, (K,) image rows and (K,) positions on the (H, W) grid.

    One gather of whole position rows from the unpadded features, a zero row standing for every neighbour that
    falls off the grid (what the padding of `neighbourhoods` holds): no padded copy of the maps."""
    batch, n_positions, channels = features.shape
    neighbours = neighbour_positions(grid, window, features.device)[positions]  # (K, window^2), -1 off the grid
    index = torch.where(neighbours < 0, batch * n_positions, rows[:, None] * n_positions + neighbours)
    position_rows = torch.cat([features.reshape(-1, channels), features.new_zeros(1, channels)])  # (B P + 1, C)
    return position_rows.index_select(0, index.reshape(-1)).reshape(len(rows), -1)  # (K, window, window, C) flat


def neighbour_positions(grid: tuple[int, int], window: int, device: torch.device) -> Tensor:
    """(P, window^2) long: each position's neighbours on the (H, W) grid in `neighbourhoods`' order (row-major in
    the window), -1 where the neighbour falls off the grid."""
    height, width = grid
    offsets = torch.arange(window, device=device) - window // 2
    down = torch.arange(height, device=device)[:, None, None, None] + offsets[:, None]  # (H, 1, window, 1)
    across = torch.arange(width, device=device)[:, None, None] + offsets  # (W, 1, window)
    inside = (down >= 0) & (down < height) & (across >= 0) & (across < width)  # (H, W, window, window)
    return torch.where(inside, down * width + across, -1).reshape(height * width, window * window)


def coverage_bucket(coverage: Tensor, n_buckets: int, min_coverage: float) -> Tensor:
    """Coverage in [0, 1] -> bucket 0 (not covered) or 1 .. n_buckets, same shape, long."""
    bucket = (coverage * n_buckets).ceil().clamp(1, n_buckets).long()
    return torch.where(coverage > min_coverage, bucket, torch.zeros_like(bucket))


def _sqrt_psd(matrix: Tensor, inverse: bool = False) -> Tensor:
    values, vectors = torch.linalg.eigh(matrix)
    values = values.clamp_min(1e-8)
    return (vectors * values ** (-0.5 if inverse else 0.5)) @ vectors.T


class GaussianTransport:
    """Optimal-transport maps between the position features of two concepts, per coverage bucket.

    n_buckets: coverage buckets; window: neighbourhood side (1 or 3); shrinkage: weight of the
    isotropic part in each covariance; min_coverage: positions covered less are never moved;
    min_positions: least training positions for a (concept, bucket) model (else the move is 0).
    covariance: False drops the covariances (A = I): the step is the difference of the two concepts'
        mean features in the bucket, the naive mean-difference edit (with n_buckets=1, window=1).
    Learned state: `means_` (G, n_buckets, D), `roots_`, `inverse_roots_` (G, n_buckets, D, D),
    `covariances_`, `counts_` (G, n_buckets); maps are built on first use and cached.
    """

    def __init__(self, n_buckets: int = 5, window: int = 3, shrinkage: float = 0.1,
                 min_coverage: float = 0.05, min_positions: int = 50, covariance: bool = True):
        self.covariance = covariance
        self.n_buckets = n_buckets
        self.window = window
        self.shrinkage = shrinkage
        self.min_coverage = min_coverage
        self.min_positions = min_positions

    def fit(self, features: Tensor, grid: tuple[int, int], concept: Tensor, coverage: Tensor,
            n_concepts: int) -> GaussianTransport:
        """features (N, P, C); concept (N, n) found objects' concepts; coverage (N, n, P); valid objects only
        should have coverage (zero it for invalid ones)."""
        dim = features.shape[-1] * self.window ** 2
        self.channels_ = features.shape[-1]
        features, concept, coverage = features.cpu(), concept.cpu(), coverage.cpu()  # the moments sum on the CPU
        shape = (n_concepts, self.n_buckets)
        self.means_ = torch.zeros(*shape, dim, dtype=torch.float64)
        self.covariances_ = torch.zeros(*shape, dim, dim, dtype=torch.float64)
        self.counts_ = torch.zeros(*shape, dtype=torch.long)
        for start in range(0, len(features), 500):
            described = neighbourhoods(features[start : start + 500].detach().double(), grid, self.window)  # (n, P, D)
            buckets = coverage_bucket(coverage[start : start + 500], self.n_buckets, self.min_coverage)  # (n, k, P)
            for k in range(concept.shape[1]):
                for c in range(n_concepts):
                    for j in range(1, self.n_buckets + 1):
                        chosen = (concept[start : start + 500, k, None] == c) & (buckets[:, k] == j)  # (n, P)
                        rows = described[chosen]
                        if len(rows):
                            self.means_[c, j - 1] += rows.sum(0)
                            self.covariances_[c, j - 1] += rows.T @ rows
                            self.counts_[c, j - 1] += len(rows)
        count = self.counts_.clamp_min(1).double()
        self.means_ /= count[..., None]
        self.covariances_ = self.covariances_ / count[..., None, None] - self.means_[..., :, None] * self.means_[..., None, :]
        eye = torch.eye(dim, dtype=torch.float64)
        average = self.covariances_.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None]
        self.covariances_ = (1 - self.shrinkage) * self.covariances_ + self.shrinkage * average * eye
        self._maps: dict[tuple[int, int, int], tuple[Tensor, Tensor]] = {}
        return self

    def state_dict(self) -> dict:
        """The fitted transport as plain tensors and numbers (the maps are rebuilt from them on use)."""
        return {"n_buckets": self.n_buckets, "window": self.window, "shrinkage": self.shrinkage,
                "min_coverage": self.min_coverage, "min_positions": self.min_positions,
                "covariance": self.covariance, "channels": self.channels_, "means": self.means_,
                "covariances": self.covariances_, "counts": self.counts_}

    @classmethod
    def from_state(cls, state: dict) -> GaussianTransport:
        """The fitted transport `state_dict()` describes, its tensors as they were saved."""
        transport = cls(state["n_buckets"], state["window"], state["shrinkage"], state["min_coverage"],
                        state["min_positions"], state["covariance"])
        transport.channels_ = int(state["channels"])
        transport.means_, transport.covariances_, transport.counts_ = (state["means"], state["covariances"],
                                                                       state["counts"])
        transport._maps = {}
        return transport

    def _map(self, source: int, target: int, bucket: int) -> tuple[Tensor, Tensor] | None:
        """(C, D) centre rows of A_ab and (C,) offset so that x_centre' = offset + rows @ x; None if unfitted."""
        key = (source, target, bucket)
        if key not in self._maps:
            if min(self.counts_[source, bucket], self.counts_[target, bucket]) < self.min_positions:
                self._maps[key] = None
                return None
            centre = self._centre_rows()
            if self.covariance:
                s_a, s_b = self.covariances_[source, bucket], self.covariances_[target, bucket]
                root_a, inverse_root_a = _sqrt_psd(s_a), _sqrt_psd(s_a, inverse=True)
                transport = inverse_root_a @ _sqrt_psd(root_a @ s_b @ root_a) @ inverse_root_a  # (D, D)
            else:
                transport = torch.eye(len(self.means_[source, bucket]), dtype=torch.float64)
            rows = transport[centre]  # (C, D)
            offset = self.means_[target, bucket][centre] - rows @ self.means_[source, bucket]
            self._maps[key] = (rows.float(), offset.float())
        return self._maps[key]

    def _centre_rows(self) -> Tensor:
        """Indices of the centre position's channels inside a neighbourhood descriptor (`neighbourhoods`' order)."""
        return (self.window * self.window // 2) * self.channels_ + torch.arange(self.channels_)

    def move(self, features: Tensor, grid: tuple[int, int], coverage: Tensor, source: Tensor,
             target: Tensor) -> Tensor:
        """The step (B, P, C) that moves each image's covered positions from concept `source` to `target`.

        features (B, P, C); coverage (B, P) of the object being changed; source, target (B,) long.
        Positions with coverage <= min_coverage, and buckets without a fitted model, get a zero step.
        """
        with torch.no_grad():
            described = neighbourhoods(features.detach().float(), grid, self.window)  # (B, P, D)
            buckets = coverage_bucket(coverage, self.n_buckets, self.min_coverage)  # (B, P)
            step = torch.zeros_like(features, dtype=torch.float32)
            for b in range(features.shape[0]):
                for j in buckets[b].unique().tolist():
                    if j == 0:
                        continue
                    mapping = self._map(int(source[b]), int(target[b]), j - 1)
                    if mapping is None:
                        continue
                    rows, offset = (part.to(features.device) for part in mapping)
                    chosen = buckets[b] == j
                    moved = described[b, chosen] @ rows.T + offset  # (n, C)
                    step[b, chosen] = moved - features[b, chosen].detach().float()
        return step.to(features.dtype)
