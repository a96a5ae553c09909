"""Batched sparse-coding kernels: orthogonal matching pursuit, top-k coding, decoding.

OMP has two kernels, chosen in `encode` (`_omp_kernel`):
- on CPU (float32 / float64), `fused_omp`: the product per block of rows, then a compiled
  loop that codes the block row by row with the row's correlations in cache. On CPUs with AMX
  (float32, `FILTER_PRODUCT`), the product is `bfloat16_filter`'s single bfloat16 product with an
  error bound, in parts of 256 rows, and the kernel forms the float32 entries it needs as oneMKL's
  sgemm does: the same codes, to the bit, in about three quarters of the time on the encode
  benchmark;
- elsewhere, or when asked for (`kernel="torch"`), `_batch_omp` below, which works on the
  whole block at once; its only Python loop is over the `s` atom-selection steps.
Both select, stop and refit by the same rules and give the same supports.

The torch kernel is batch OMP (Rubinstein, Zibulevsky and Elad, 2008): the correlations
`X D^T` (the one (n, d) x (d, K) product, written into a buffer allocated once) and the
Gram matrix `G = D D^T` are computed once. Each selection step updates the residual
correlations in place by the change of the support's coefficients times their Gram
rows, one sparse x dense product that reads t + 1 Gram rows and the (n, K) buffer once
(cost O(t K) per sample and step instead of O(K d)). The least-squares fit on the
support is kept through the inverse of its Cholesky factor, grown by one row per step,
so the solves are batched (n, s, s) products rather than one small LAPACK call per
sample. Past the product, a step is a few passes over (n, K): the arg-max scan (see
`_largest`) and the Gram update; `benchmarks/dictionary_encode.py` prints where the
time goes.

Non-negative OMP (the default, `nonnegative=True`), exactly:
1. select the atom with the largest *positive* correlation with the residual (ties go to
   the lowest atom index, in both modes, as in scikit-learn); a
   sample with no positive correlation (or whose new atom is linearly dependent on
   its support) stops there and keeps its support;
2. refit the coefficients by unconstrained least squares on the support;
3. after the last step, drop coefficients that came out negative and refit the rest
   by least squares on the remaining support (twice), then clamp at zero.
With `nonnegative=False` it is plain OMP (selection by largest |correlation|), and
the codes equal scikit-learn's `orthogonal_mp_gram`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.profiler import record_function

from lace.dictionary import fused_omp
from lace.dictionary.bfloat16_filter import BLOCK_ROWS, FilterProduct

METHODS = ("omp", "topk")
KERNELS = ("fused", "torch")  # OMP kernels: compiled row by row on CPU, or batched torch operations
LANES = 128  # width of the vectorised max in the arg-max scan (K must be a multiple, else a plain scan)
FUSED_MIN_ATOMS = 1024
"""Dictionaries this large get the fused kernel by default. Its first call in a fresh install compiles for
about 11 s (then 0.3 s from numba's disk cache); below this size the batched torch kernel costs a few
hundred milliseconds more over a whole fit, which does not repay that compilation."""
CPU_BLOCK_ROWS = 1024  # rows per block on CPU (fastest measured for K = 4096: 16 MB of correlations)
DEVICE_BLOCK_ROWS = 8192  # rows per block on an accelerator: fewer, larger kernels
FILTER_PRODUCT = True  # the fused kernel filters with a bfloat16 product where it can (`bfloat16_filter`); same codes


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
    kernel: str | None = None,
) -> Tensor | SparseCodes:
    """Sparse codes of `x` (N, d) over `atoms` (K, d) with at most `sparsity` non-zeros per row.

    method: "omp" (batch orthogonal matching pursuit) or "topk" (the `sparsity`
    largest correlations, refitted by least squares on that support).
    Returns (N, K) dense codes when `dense`, else `SparseCodes` with (N, sparsity)
    indices and values. Rows are processed `chunk_size` at a time (default 1024 on CPU,
    8192 elsewhere); `gram` (K, K) = atoms @ atoms.T may be passed in to save recomputing it.
    kernel: OMP's kernel, "fused" (CPU, float32 or float64) or "torch"; by default the fused
    one wherever it runs for dictionaries of at least `FUSED_MIN_ATOMS` atoms.
    """
    _check_arguments(x, atoms, sparsity, method, kernel)
    n_atoms = atoms.shape[0]
    x = x.to(atoms.dtype)
    if gram is None:
        with record_function("encode/gram"):
            gram = atoms @ atoms.T
    if chunk_size is None:
        chunk_size = CPU_BLOCK_ROWS if atoms.device.type == "cpu" else DEVICE_BLOCK_ROWS
    buffers = None
    if method == "omp" and x.shape[0]:
        rows = min(chunk_size, x.shape[0])
        buffers = _OmpBuffers(rows, n_atoms, atoms.dtype, atoms.device)
        omp = _omp_kernel(kernel, atoms)
    index_chunks, value_chunks = [], []
    for start in range(0, x.shape[0], chunk_size):
        chunk = x[start : start + chunk_size]
        if method == "omp":
            indices, values = omp(chunk, atoms, gram, sparsity, nonnegative, buffers)
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


def _omp_kernel(kernel: str | None, atoms: Tensor):
    """The OMP kernel for `atoms`' device and dtype: `_fused_omp` or `_batch_omp`."""
    fused_runs = atoms.device.type == "cpu" and atoms.dtype in (torch.float32, torch.float64)
    if kernel == "fused" and not fused_runs:
        raise ValueError(f"kernel: 'fused' runs on CPU in float32 or float64, got {atoms.device} {atoms.dtype}")
    if kernel == "torch" or not fused_runs or (kernel is None and atoms.shape[0] < FUSED_MIN_ATOMS):
        return _batch_omp
    return _fused_omp


def _check_arguments(x: Tensor, atoms: Tensor, sparsity: int, method: str, kernel: str | None) -> None:
    """Raise `ValueError` on arguments `encode` cannot honour, naming the argument."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    if x.ndim != 2 or atoms.ndim != 2 or x.shape[1] != atoms.shape[1]:
        raise ValueError(
            f"expected x (N, d) and atoms (K, d) with the same d, got {tuple(x.shape)} and "
            f"{tuple(atoms.shape)}"
        )
    if not 1 <= sparsity <= atoms.shape[0]:
        raise ValueError(f"sparsity: expected 1..{atoms.shape[0]}, got {sparsity}")


def _fused_omp(
    x: Tensor, atoms: Tensor, gram: Tensor, sparsity: int, nonnegative: bool, buffers: _OmpBuffers
) -> tuple[Tensor, Tensor]:
    """OMP on one block of rows with the compiled row-by-row kernel. Returns indices (n, s) and values (n, s).
    With the bfloat16 filter the block goes in parts of `bfloat16_filter.BLOCK_ROWS` rows, product then kernel."""
    step = BLOCK_ROWS if buffers.filter(atoms) is not None else max(x.shape[0], 1)
    gram_tables = buffers.gram_tables(gram)
    indices, values = [], []
    for start in range(0, x.shape[0], step):
        with record_function("omp/product"):
            correlations, filtered = buffers.product(x[start : start + step], atoms)  # (n, K) X D^T or its filter
        with record_function("omp/fused_rows"):
            part = fused_omp.omp_rows(correlations.numpy(), *gram_tables, sparsity, nonnegative, _tiny(atoms.dtype),
                                      filtered)
        indices.append(torch.from_numpy(part[0]))
        values.append(torch.from_numpy(part[1]))
    return torch.cat(indices), torch.cat(values)


def _tiny(dtype: torch.dtype) -> float:
    """The correlation at or below which a row stops: 16 ulps of 1 in `dtype` (both kernels)."""
    return torch.finfo(dtype).eps * 16


def _batch_omp(
    x: Tensor, atoms: Tensor, gram: Tensor, sparsity: int, nonnegative: bool, buffers: _OmpBuffers
) -> tuple[Tensor, Tensor]:
    """Batch OMP on one block of rows. Returns indices (n, s) and values (n, s)."""
    n = x.shape[0]
    dtype, device = atoms.dtype, atoms.device
    gram_diag = gram.diagonal()
    tiny = _tiny(dtype)
    correlations = buffers.correlations[:n]  # (n, K)
    with record_function("omp/product"):
        torch.mm(x, atoms.T, out=correlations)  # X D^T: the one product
    indices = torch.zeros(n, sparsity, dtype=torch.long, device=device)
    live = torch.zeros(n, sparsity, dtype=torch.bool, device=device)
    stopped = torch.zeros(n, dtype=torch.bool, device=device)
    # inverse of the Cholesky factor of the support's Gram matrix, lower triangular
    chol_inv = torch.zeros(n, sparsity, sparsity, dtype=dtype, device=device)
    support_correlations = torch.zeros(n, sparsity, dtype=dtype, device=device)  # x . d_i
    previous = x.new_zeros(n, 0)
    for step in range(sparsity):
        with record_function("omp/argmax"):
            best, chosen = _largest(correlations, absolute=not nonnegative)  # (n,), (n,)
        with record_function("omp/cholesky"):
            stopped |= best <= tiny
            if step == 0:
                diag_sq = gram_diag[chosen]
            else:
                cross = gram[indices[:, :step], chosen.unsqueeze(1)]  # (n, step) = G[I, k]
                w = torch.bmm(chol_inv[:, :step, :step], cross.unsqueeze(-1)).squeeze(-1)  # L w = g
                diag_sq = gram_diag[chosen] - (w * w).sum(1)
            # an atom (nearly) in the span of the support adds nothing: stop that sample
            stopped |= diag_sq <= fused_omp.DEPENDENT * gram_diag[chosen]
            inv_diag = torch.where(stopped, torch.ones_like(diag_sq), diag_sq.clamp_min(tiny).rsqrt())
            if step:  # new last row of L^{-1}: [-(w^T L^{-1}) / l_tt, 1 / l_tt]
                row = -torch.bmm(w.unsqueeze(1), chol_inv[:, :step, :step]).squeeze(1)
                chol_inv[:, step, :step] = row * (inv_diag * ~stopped).unsqueeze(1)
            chol_inv[:, step, step] = inv_diag
            indices[:, step] = chosen
            live[:, step] = ~stopped
            support_correlations[:, step] = torch.einsum("nd,nd->n", x, atoms[chosen])  # x . d_k
            support = step + 1
            factor = chol_inv[:, :support, :support]
            rhs = (support_correlations[:, :support] * live[:, :support]).unsqueeze(-1)
            coefficients = torch.bmm(factor.transpose(1, 2), torch.bmm(factor, rhs)).squeeze(-1)  # L^-T L^-1 rhs
        if step + 1 == sparsity:
            break
        with record_function("omp/correlation_update"):
            # residual correlations X D^T - a_I G[I]: update in place by the change of a_I
            change = coefficients - torch.nn.functional.pad(previous, (0, 1))
            _subtract_gram_rows(correlations, change, indices[:, :support], gram)
        previous = coefficients
    values = coefficients * live
    if nonnegative:
        with record_function("omp/refit"):
            values = _refit_nonnegative(values, indices, support_correlations, gram)
    return indices, values


def _subtract_gram_rows(correlations: Tensor, coefficients: Tensor, indices: Tensor, gram: Tensor) -> None:
    """correlations -= sum_j coefficients[:, j] * gram[indices[:, j]], in place.

    One sparse (CSR, t non-zeros per row) x dense product added into the (n, K) buffer:
    no (n, t, K) gather and no extra copy of the buffer.
    """
    n, support = coefficients.shape
    row_starts = torch.arange(0, n * support + 1, support, device=gram.device)
    with warnings.catch_warnings():  # CSR support is marked beta; this product is all we use of it
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        sparse = torch.sparse_csr_tensor(
            row_starts, indices.reshape(-1), coefficients.reshape(-1), (n, gram.shape[0]), check_invariants=False
        )
    correlations.addmm_(sparse, gram, alpha=-1.0)


def _largest(correlations: Tensor, absolute: bool) -> tuple[Tensor, Tensor]:
    """Largest entry (or |entry|) of each row of (n, K) and its first column: (n,) values, (n,) long.

    A row-wise arg-max is a slow scalar scan; a max across the K / LANES lanes of width
    LANES is a vectorised pass, after which only one strided column of K / LANES entries
    per row is searched.
    """
    n, n_atoms = correlations.shape
    if n_atoms % LANES:
        return (correlations.abs() if absolute else correlations).max(dim=1)
    lanes = correlations.view(n, n_atoms // LANES, LANES)
    lane_best = lanes.amax(dim=1)  # (n, LANES)
    if absolute:
        lane_best = torch.maximum(lane_best, lanes.amin(dim=1).neg_())
    best, lane = lane_best.max(dim=1)  # (n,)
    column = lanes[torch.arange(n, device=correlations.device), :, lane]  # (n, K / LANES)
    chosen = (column.abs() if absolute else column).argmax(dim=1) * LANES + lane
    # the first index overall, not the first lane's: rows where several lanes tie scan the whole row
    tied = ((lane_best == best.unsqueeze(1)).sum(dim=1) > 1).nonzero().squeeze(1)
    if tied.numel():
        rows = correlations[tied]
        chosen[tied] = (rows.abs() if absolute else rows).argmax(dim=1)
    return best, chosen


class _OmpBuffers:
    """The (n, K) residual correlations of one block of rows, allocated once and reused by
    every block (a fresh large tensor per block costs page faults), and the fused kernel's
    tables of the Gram matrix and bfloat16 filter, made once."""

    def __init__(self, rows: int, n_atoms: int, dtype: torch.dtype, device: torch.device):
        self.correlations = torch.empty(rows, n_atoms, dtype=dtype, device=device)
        self._gram_tables = None
        self._filter = None

    def product(self, x: Tensor, atoms: Tensor) -> tuple[Tensor, fused_omp.FilteredProduct | None]:
        """(n, K) X D^T for the fused kernel, in the buffer, and None: the product in the atoms' dtype. Where
        `FilterProduct` is usable (float32 on CPUs with AMX, `FILTER_PRODUCT`), its bfloat16 product instead, with
        what the kernel needs to form the float32 entries it uses."""
        correlations = self.correlations[: x.shape[0]]
        filtering = self.filter(atoms)
        filtered = filtering(x, correlations) if filtering is not None else None
        if filtered is not None:
            return correlations, filtered
        return torch.mm(x, atoms.T, out=correlations), None

    def filter(self, atoms: Tensor) -> FilterProduct | None:
        """The fused kernel's `FilterProduct` for `atoms`, where it runs (`FILTER_PRODUCT` and
        `FilterProduct.usable`: float32 atoms on CPUs with AMX); else None."""
        if not FILTER_PRODUCT:
            return None
        if self._filter is None:
            self._filter = FilterProduct(atoms, self.correlations.shape[0])
        return self._filter if self._filter.usable else None

    def gram_tables(self, gram: Tensor):
        """`gram` as a (K, K) numpy array with contiguous rows, its diagonal (K,), its (K, K / TILE) tile
        maxima and its int8 codes (K, K) with their steps (K,) (`fused_omp.quantized_gram`)."""
        if self._gram_tables is None:
            with record_function("omp/tile_maxima"):
                rows = gram.detach().to(self.correlations.dtype).contiguous().numpy()
                self._gram_tables = (rows, rows.diagonal().copy(), fused_omp.tile_maxima(rows),
                                     *fused_omp.quantized_gram(rows))
        return self._gram_tables


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
    system = system + fused_omp.RIDGE * eye
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
