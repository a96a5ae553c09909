"""Batched sparse-coding kernels: orthogonal matching pursuit, top-k coding, decoding.

Every kernel works on a whole batch at once; the only Python loop is over the `s`
atom-selection steps (and over chunks of rows, to bound memory).

OMP is batch OMP (Rubinstein, Zibulevsky and Elad, 2008): the correlations
`X D^T` (the one (n, d) x (d, K) product) and the Gram matrix `G = D D^T` are computed
once. Each step then works on (n, K) correlations only, with Gram-Schmidt done in
correlation space: the chosen atom k is orthogonalised against the support's
orthonormal directions q_j, whose correlations `D q_j` are kept, so
`D q_t = (G[k] - sum_j (q_j . d_k) D q_j) / l_tt` costs one Gram row and t stored
rows, and the residual correlations move by `-(q_t . x) D q_t`. The numbers
`q_j . d_k` and `l_tt` are the rows of the Cholesky factor L of `G[I, I]`, so the
coefficients come out at the end from one batched triangular solve `L^T a = z`,
with `z_j = q_j . x`. Rows are coded a block at a time (default 256 on CPU, so that the
block's correlations stay in cache across the steps), in buffers allocated once.

Non-negative OMP (the default, `nonnegative=True`), exactly:
1. select the atom with the largest *positive* correlation with the residual; a
   sample with no positive correlation (or whose new atom is linearly dependent on
   its support) stops there and keeps its support;
2. refit the coefficients by unconstrained least squares on the support;
3. after the last step, drop coefficients that came out negative and refit the rest
   by least squares on the remaining support (twice), then clamp at zero.
With `nonnegative=False` it is plain OMP (selection by largest |correlation|), and
the codes equal scikit-learn's `orthogonal_mp_gram`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.profiler import record_function

METHODS = ("omp", "topk")
LANES = 128  # width of the vectorised max in the arg-max scan (K must be a multiple, else a plain scan)
CPU_BLOCK_ROWS = 256  # rows per block on CPU: the block's (n, K) correlations stay in cache
DEVICE_BLOCK_ROWS = 8192  # rows per block on an accelerator: fewer, larger kernels


@dataclass
class SparseCodes:
    """Sparse codes with a fixed number of slots per row.

    indices: (N, s) long, atom of each slot; values: (N, s) float, its coefficient.
    Unused slots hold value 0 (their index is arbitrary). n_atoms: K.
    """

    indices: Tensor
    values: Tensor
    n_atoms: int

    def to_dense(self) -> Tensor:
        """(N, K) dense codes."""
        dense = torch.zeros(
            self.values.shape[0], self.n_atoms, dtype=self.values.dtype, device=self.values.device
        )
        return dense.scatter_add_(1, self.indices, self.values)


def encode(
    x: Tensor,
    atoms: Tensor,
    sparsity: int,
    method: str = "omp",
    nonnegative: bool = True,
    dense: bool = False,
    chunk_size: int | None = None,
    gram: Tensor | None = None,
) -> Tensor | SparseCodes:
    """Sparse codes of `x` (N, d) over `atoms` (K, d) with at most `sparsity` non-zeros per row.

    method: "omp" (batch orthogonal matching pursuit) or "topk" (the `sparsity`
    largest correlations, refitted by least squares on that support).
    Returns (N, K) dense codes when `dense`, else `SparseCodes` with (N, sparsity)
    indices and values. Rows are processed `chunk_size` at a time (default 256 on CPU,
    8192 elsewhere); `gram` (K, K) = atoms @ atoms.T may be passed in to save recomputing it.
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if x.ndim != 2 or atoms.ndim != 2 or x.shape[1] != atoms.shape[1]:
        raise ValueError(
            f"expected x (N, d) and atoms (K, d) with the same d, got {tuple(x.shape)} and "
            f"{tuple(atoms.shape)}"
        )
    n_atoms = atoms.shape[0]
    if not 1 <= sparsity <= n_atoms:
        raise ValueError(f"sparsity: expected 1..{n_atoms}, got {sparsity}")
    x = x.to(atoms.dtype)
    if gram is None:
        gram = atoms @ atoms.T
    if chunk_size is None:
        chunk_size = CPU_BLOCK_ROWS if atoms.device.type == "cpu" else DEVICE_BLOCK_ROWS
    buffers = None
    if method == "omp" and x.shape[0]:
        rows = min(chunk_size, x.shape[0])
        buffers = _OmpBuffers(rows, n_atoms, sparsity, atoms.dtype, atoms.device)
    index_chunks, value_chunks = [], []
    for start in range(0, x.shape[0], chunk_size):
        chunk = x[start : start + chunk_size]
        if method == "omp":
            indices, values = _batch_omp(chunk, atoms, gram, sparsity, nonnegative, buffers)
        else:
            indices, values = _topk(chunk, atoms, gram, sparsity, nonnegative)
        index_chunks.append(indices)
        value_chunks.append(values)
    if index_chunks:
        codes = SparseCodes(torch.cat(index_chunks), torch.cat(value_chunks), n_atoms)
    else:
        empty = x.new_zeros(0, sparsity)
        codes = SparseCodes(empty.long(), empty, n_atoms)
    return codes.to_dense() if dense else codes


def decode(codes: Tensor | SparseCodes, atoms: Tensor, chunk_size: int = 16384) -> Tensor:
    """Reconstruction `a D` (N, d) from dense (N, K) or sparse codes and atoms (K, d)."""
    if isinstance(codes, Tensor):
        return codes.to(atoms.dtype) @ atoms
    parts = []
    for start in range(0, codes.indices.shape[0], chunk_size):
        indices = codes.indices[start : start + chunk_size]
        values = codes.values[start : start + chunk_size].to(atoms.dtype)
        parts.append(torch.einsum("ns,nsd->nd", values, atoms[indices]))  # (n, d)
    if not parts:
        return atoms.new_zeros(0, atoms.shape[1])
    return torch.cat(parts)


def _batch_omp(
    x: Tensor, atoms: Tensor, gram: Tensor, sparsity: int, nonnegative: bool, buffers: _OmpBuffers
) -> tuple[Tensor, Tensor]:
    """Batch OMP on one block of rows. Returns indices (n, s) and values (n, s)."""
    n = x.shape[0]
    dtype, device = atoms.dtype, atoms.device
    gram_diag = gram.diagonal()
    tiny = torch.finfo(dtype).eps * 16
    rows = torch.arange(n, device=device)
    correlations, directions = buffers.take(n)  # (n, K), (s - 1, n, K)
    with record_function("omp/product"):
        torch.mm(x, atoms.T, out=correlations)  # X D^T: the one product
    indices = torch.zeros(n, sparsity, dtype=torch.long, device=device)
    live = torch.zeros(n, sparsity, dtype=torch.bool, device=device)
    stopped = torch.zeros(n, dtype=torch.bool, device=device)
    cholesky = torch.zeros(n, sparsity, sparsity, dtype=dtype, device=device)  # L of G[I, I], lower
    inverse_lengths = torch.zeros(n, sparsity, dtype=dtype, device=device)  # 1 / l_jj
    projections = torch.zeros(n, sparsity, dtype=dtype, device=device)  # z_j = q_j . x
    for step in range(sparsity):
        with record_function("omp/argmax"):
            best, chosen = _largest(correlations, absolute=not nonnegative)  # (n,), (n,)
        with record_function("omp/cholesky"):
            best_correlation = correlations[rows, chosen]  # d_k . r, signed
            stopped |= best <= tiny
            # directions[j] holds l_jj D q_j, so w_j = q_j . d_k = directions[j][k] / l_jj: L's new row is [w, l_tt]
            cross = directions[:step, rows, chosen].T * inverse_lengths[:, :step]  # (n, step)
            diag_sq = gram_diag[chosen] - (cross * cross).sum(1)
            # an atom (nearly) in the span of the support adds nothing: stop that sample
            stopped |= diag_sq <= 1e-7 * gram_diag[chosen]
            inverse_length = torch.where(stopped, torch.ones_like(diag_sq), diag_sq.clamp_min(tiny).rsqrt())
            projection = torch.where(stopped, torch.zeros_like(diag_sq), best_correlation * inverse_length)
            cholesky[:, step, :step] = cross * ~stopped.unsqueeze(1)
            cholesky[:, step, step] = inverse_length.reciprocal()
            inverse_lengths[:, step] = inverse_length
            projections[:, step] = projection
            indices[:, step] = chosen
            live[:, step] = ~stopped
        if step + 1 == sparsity:
            break
        direction = directions[step]  # (n, K)
        with record_function("omp/gram_update"):
            # l_tt D q_t = G[k] - sum_j w_j D q_j: one Gram row per sample and step, and t stored rows
            torch.index_select(gram, 0, chosen, out=direction)
            weights = cross * inverse_lengths[:, :step]  # (n, step): w_j / l_jj
            for earlier in range(step):  # one vectorised pass each (a batched (1, t) x (t, K) loops per row)
                direction.addcmul_(directions[earlier], weights[:, earlier : earlier + 1], value=-1.0)
        with record_function("omp/correlation_update"):
            # residual r <- r - (q_t . r) q_t and q_t . r = q_t . x, so D r <- D r - z_t D q_t
            correlations.addcmul_(direction, (projection * inverse_length).unsqueeze(1), value=-1.0)
    with record_function("omp/solve"):
        # x's projection on the support is Q z = D_I^T L^{-T} z, so the coefficients are L^{-T} z
        values = torch.linalg.solve_triangular(
            cholesky.transpose(1, 2), projections.unsqueeze(-1), upper=True
        ).squeeze(-1) * live
    if nonnegative:
        with record_function("omp/refit"):
            values = _refit_nonnegative(values, indices, _support_correlations(x, atoms, indices), gram)
    return indices, values


def _largest(correlations: Tensor, absolute: bool) -> tuple[Tensor, Tensor]:
    """Largest entry (or |entry|) of each row of (n, K) and its column: (n,) values, (n,) long.

    A row-wise arg-max is a slow scalar scan; a max across the K / LANES lanes of width
    LANES is a vectorised pass, after which only one strided column of K / LANES entries
    per row is searched.
    """
    n, n_atoms = correlations.shape
    if n_atoms % LANES:
        if not absolute:
            return correlations.max(dim=1)
        best, chosen = correlations.max(dim=1)
        lowest, lowest_index = correlations.min(dim=1)
        negative_wins = -lowest > best
        return torch.where(negative_wins, -lowest, best), torch.where(negative_wins, lowest_index, chosen)
    lanes = correlations.view(n, n_atoms // LANES, LANES)
    lane_best = lanes.amax(dim=1)  # (n, LANES)
    if absolute:
        lane_best = torch.maximum(lane_best, lanes.amin(dim=1).neg_())
    best, lane = lane_best.max(dim=1)  # (n,)
    column = lanes[torch.arange(n, device=correlations.device), :, lane]  # (n, K / LANES)
    block = (column.abs() if absolute else column).argmax(dim=1)
    return best, block * LANES + lane


def _support_correlations(x: Tensor, atoms: Tensor, indices: Tensor) -> Tensor:
    """(n, s) inner products of each row of x (n, d) with the atoms (K, d) of its support (n, s)."""
    return torch.einsum("nd,nsd->ns", x, atoms[indices])


class _OmpBuffers:
    """The (n, K) residual correlations and (s - 1, n, K) direction correlations of one block of
    rows, allocated once and reused by every block (fresh large tensors cost page faults)."""

    def __init__(self, rows: int, n_atoms: int, sparsity: int, dtype: torch.dtype, device: torch.device):
        self.correlations = torch.empty(rows, n_atoms, dtype=dtype, device=device)
        self.directions = torch.empty(max(sparsity - 1, 0), rows, n_atoms, dtype=dtype, device=device)

    def take(self, rows: int) -> tuple[Tensor, Tensor]:
        return self.correlations[:rows], self.directions[:, :rows]


def _topk(
    x: Tensor, atoms: Tensor, gram: Tensor, sparsity: int, nonnegative: bool
) -> tuple[Tensor, Tensor]:
    """Top-k support by correlation, refitted by least squares. Returns (n, s) indices and values."""
    correlations = x @ atoms.T  # (n, K)
    scores = correlations if nonnegative else correlations.abs()
    top_scores, indices = scores.topk(sparsity, dim=1)
    keep = top_scores > 0 if nonnegative else torch.ones_like(top_scores, dtype=torch.bool)
    support_correlations = correlations.gather(1, indices)  # (n, s)
    values = _least_squares_on_support(indices, keep, support_correlations, gram)
    if nonnegative:
        values = _refit_nonnegative(values, indices, support_correlations, gram)
    return indices, values


def _least_squares_on_support(
    indices: Tensor, keep: Tensor, support_correlations: Tensor, gram: Tensor
) -> Tensor:
    """Least-squares coefficients on the kept slots of each row's support; dropped slots get 0.

    support_correlations: (n, s) inner products x . d_i of each row with its support's atoms.
    Solves G[I, I] a = X D[I]^T per row with dropped slots replaced by identity rows,
    so the batch stays one `(n, s, s)` solve.
    """
    sub_gram = gram[indices.unsqueeze(2), indices.unsqueeze(1)]  # (n, s, s)
    pair_keep = keep.unsqueeze(2) & keep.unsqueeze(1)
    eye = torch.eye(indices.shape[1], dtype=gram.dtype, device=gram.device)
    system = torch.where(pair_keep, sub_gram, eye.expand_as(sub_gram))
    # a tiny ridge keeps duplicated or dependent atoms solvable
    system = system + 1e-6 * eye
    rhs = support_correlations * keep
    return torch.linalg.solve(system, rhs.unsqueeze(-1)).squeeze(-1) * keep


def _refit_nonnegative(
    values: Tensor, indices: Tensor, support_correlations: Tensor, gram: Tensor, rounds: int = 2
) -> Tensor:
    """Drop negative coefficients and refit the rest by least squares, `rounds` times; clamp at 0."""
    for _ in range(rounds):
        negative = values < 0
        if not bool(negative.any()):
            break
        keep = values > 0
        values = _least_squares_on_support(indices, keep, support_correlations, gram)
    return values.clamp_min(0)
