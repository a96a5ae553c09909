"""Batch OMP on CPU fused row by row, compiled with numba.

The caller computes the correlations `X D^T` of a block of rows (one BLAS product, the
floor) and the Gram matrix `G = D D^T`. `omp_rows` then codes the block one row at a
time, so that the row's K correlations stay in the core's L1/L2 cache for all s steps
instead of s passes over the whole (B, K) block:
- selection: the first atom with the largest correlation (or |correlation|), found from
  the maxima of 64-entry chunks, which the previous step's update produced on the fly;
- the support's Cholesky factor grows by one row, and the coefficients are refitted by
  least squares on the support (s x s triangular solves in float64);
- the residual correlations are updated by the change of the coefficients times the
  support atoms' Gram rows (G is symmetric, so rows are contiguous), while the chunk
  maxima for the next selection are taken.
The algorithm, its stopping rules and the non-negative refit are those of
`sparse_coding._batch_omp`, which stays the kernel for other devices; the two give the
same supports and codes equal to float32 rounding.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

CHUNK = 64  # entries per chunk maximum: a selection reads K / CHUNK maxima and one chunk
RIDGE = 1e-6  # added to the diagonal of the non-negative refit's systems, as in `_least_squares_on_support`
DEPENDENT = 1e-7  # an atom whose squared distance to the support's span is below this share of its norm stops the row
# Reassociation and fused multiply-adds: the chunk maxima are exact in any order, and the
# correlation update's rounding changes by less than float32's own.
FAST_MATH = True


def _compiled(function):
    """`function` compiled without the GIL, cached on disk when numba finds a writable cache
    directory (next to this file, else NUMBA_CACHE_DIR or the user's cache), else per process."""
    try:
        return numba.njit(nogil=True, fastmath=FAST_MATH, cache=True)(function)
    except RuntimeError:  # no cache location is writable
        return numba.njit(nogil=True, fastmath=FAST_MATH)(function)


def omp_rows(
    correlations: np.ndarray, gram: np.ndarray, sparsity: int, nonnegative: bool, tiny: float
) -> tuple[np.ndarray, np.ndarray]:
    """OMP codes of a block from its correlations (n, K) = X D^T and the Gram matrix (K, K).

    `correlations` is read only. Rows stop early when the best correlation is at most
    `tiny` or the chosen atom lies in the span of the support; their remaining slots repeat
    the atom chosen at the stop with value 0. Returns indices (n, s) int64 and values
    (n, s) of the correlations' dtype.
    """
    n, n_atoms = correlations.shape
    key_dtype = np.int32 if correlations.dtype == np.float32 else np.int64
    indices = np.empty((n, sparsity), dtype=np.int64)
    values = np.empty((n, sparsity), dtype=correlations.dtype)
    chunk_keys = np.empty((n_atoms + CHUNK - 1) // CHUNK, dtype=key_dtype)
    _omp_rows(correlations, gram, sparsity, nonnegative, tiny, indices, values, chunk_keys)
    return indices, values


@_compiled
def _omp_rows(correlations, gram, sparsity, nonnegative, tiny, indices, values, chunk_keys):
    n_rows, n_atoms = correlations.shape
    absolute = not nonnegative
    residual = np.empty(n_atoms, dtype=correlations.dtype)  # the row's residual correlations
    factor = np.zeros((sparsity, sparsity))  # Cholesky factor L of G[I, I], lower triangular
    cross = np.empty(sparsity)  # w with L w = G[I, k]
    targets = np.empty(sparsity)  # x . d_i of the support atoms
    coefficients = np.zeros(sparsity)
    previous = np.zeros(sparsity)
    change = np.empty(sparsity, dtype=correlations.dtype)
    scratch = np.empty(sparsity)
    support = np.empty(sparsity, dtype=np.int64)
    for row in range(n_rows):
        original = correlations[row]
        _copy_with_chunk_keys(original, residual, chunk_keys, absolute)
        previous[:] = 0.0
        coefficients[:] = 0.0
        live = 0
        chosen = 0
        for step in range(sparsity):
            best, chosen = _first_largest(residual, chunk_keys, absolute)
            if best <= tiny:
                break
            gram_row = gram[chosen]
            diagonal = np.float64(gram_row[chosen])
            squared_distance = diagonal
            for j in range(step):  # forward substitution L w = G[I, k]
                total = np.float64(gram_row[support[j]])
                for i in range(j):
                    total -= factor[j, i] * cross[i]
                cross[j] = total / factor[j, j]
                squared_distance -= cross[j] * cross[j]
            if squared_distance <= DEPENDENT * diagonal:
                break
            for j in range(step):
                factor[step, j] = cross[j]
            factor[step, step] = np.sqrt(max(squared_distance, tiny))
            support[step] = chosen
            targets[step] = original[chosen]
            live = step + 1
            _cholesky_solve(factor, targets, live, scratch, coefficients)
            if live == sparsity:
                break
            for j in range(live):
                change[j] = coefficients[j] - previous[j]
                previous[j] = coefficients[j]
            _subtract_gram_rows(residual, gram, support, change, live, chunk_keys, absolute)
        last = support[live - 1] if live == sparsity else chosen
        for j in range(sparsity):
            indices[row, j] = support[j] if j < live else last
            values[row, j] = coefficients[j] if j < live else 0.0
        if nonnegative and live:
            _refit_nonnegative(values[row], support, live, targets, gram, factor, scratch, coefficients)


@intrinsic
def _order_key(typingctx, value, absolute):
    """An integer that orders like |value| (absolute) or value: the float's bits without the
    sign bit, or for negatives with all bits but the sign flipped. int32 for float32, int64
    for float64. Integer maxima vectorise where float ones do not."""
    width = value.bitwidth
    key_type = types.int32 if width == 32 else types.int64

    def codegen(context, builder, signature, args):
        number, is_absolute = args
        integer = ir.IntType(width)
        bits = builder.bitcast(number, integer)
        magnitude = ir.Constant(integer, (1 << (width - 1)) - 1)
        without_sign = builder.and_(bits, magnitude)
        negative_mask = builder.and_(builder.ashr(bits, ir.Constant(integer, width - 1)), magnitude)
        return builder.select(is_absolute, without_sign, builder.xor(bits, negative_mask))

    return key_type(value, types.boolean), codegen


@_compiled
def _copy_with_chunk_keys(source, residual, chunk_keys, absolute):
    """residual = source, and chunk_keys[c] = the largest order key of chunk c."""
    n_atoms = source.shape[0]
    for chunk in range(chunk_keys.shape[0]):
        start = chunk * CHUNK
        stop = min(start + CHUNK, n_atoms)
        best = _order_key(source[start], absolute)
        for i in range(start, stop):
            value = source[i]
            residual[i] = value
            best = max(best, _order_key(value, absolute))
        chunk_keys[chunk] = best


@_compiled
def _first_largest(residual, chunk_keys, absolute):
    """(largest entry or |entry|, its first index), from the chunk keys and one chunk."""
    best = chunk_keys[0]
    for chunk in range(1, chunk_keys.shape[0]):
        best = max(best, chunk_keys[chunk])
    chunk = 0
    while chunk < chunk_keys.shape[0] - 1 and chunk_keys[chunk] != best:
        chunk += 1
    index = chunk * CHUNK
    last = min(index + CHUNK, residual.shape[0]) - 1
    while index < last and _order_key(residual[index], absolute) != best:
        index += 1  # the bounds only matter for NaN, which matches nothing
    value = residual[index]
    return (abs(value) if absolute else value), index


@_compiled
def _subtract_gram_rows(residual, gram, support, change, size, chunk_keys, absolute):
    """residual -= sum_j change[j] * gram[support[j]] for j < size, four Gram rows per pass
    (a short group repeats its first row with weight 0); the last pass takes the chunk keys."""
    n_atoms = residual.shape[0]
    zero = change[0] - change[0]
    for first in range(0, size, 4):
        count = min(4, size - first)
        row0 = gram[support[first]]
        row1 = gram[support[first + 1]] if count > 1 else row0
        row2 = gram[support[first + 2]] if count > 2 else row0
        row3 = gram[support[first + 3]] if count > 3 else row0
        weight0 = change[first]
        weight1 = change[first + 1] if count > 1 else zero
        weight2 = change[first + 2] if count > 2 else zero
        weight3 = change[first + 3] if count > 3 else zero
        if first + count < size:
            for i in range(n_atoms):
                residual[i] -= weight0 * row0[i] + weight1 * row1[i] + weight2 * row2[i] + weight3 * row3[i]
            continue
        for chunk in range(chunk_keys.shape[0]):
            start = chunk * CHUNK
            stop = min(start + CHUNK, n_atoms)
            value = residual[start] - (
                weight0 * row0[start] + weight1 * row1[start] + weight2 * row2[start] + weight3 * row3[start]
            )
            residual[start] = value
            best = _order_key(value, absolute)
            for i in range(start + 1, stop):
                value = residual[i] - (weight0 * row0[i] + weight1 * row1[i] + weight2 * row2[i] + weight3 * row3[i])
                residual[i] = value
                best = max(best, _order_key(value, absolute))
            chunk_keys[chunk] = best


@_compiled
def _cholesky_solve(factor, rhs, size, scratch, solution):
    """solution[:size] = (L L^T)^-1 rhs[:size] for the lower-triangular factor[:size, :size]."""
    for j in range(size):  # L y = rhs
        total = rhs[j]
        for i in range(j):
            total -= factor[j, i] * scratch[i]
        scratch[j] = total / factor[j, j]
    for j in range(size - 1, -1, -1):  # L^T a = y
        total = scratch[j]
        for i in range(j + 1, size):
            total -= factor[i, j] * solution[i]
        solution[j] = total / factor[j, j]


@_compiled
def _refit_nonnegative(values, support, live, targets, gram, factor, scratch, solution):
    """Drop negative coefficients of one row and refit the rest by least squares on the
    remaining support (ridge RIDGE), twice at most; then clamp at 0. `values` is updated in place."""
    kept = np.empty(live, dtype=np.int64)
    kept_targets = np.empty(live)
    for _ in range(2):
        size = 0
        negative = False
        for j in range(live):
            if values[j] < 0:
                negative = True
            elif values[j] > 0:
                kept[size] = j
                size += 1
        if not negative:
            break
        for a in range(size):  # Cholesky factor of G[kept, kept] + RIDGE I
            kept_targets[a] = targets[kept[a]]
            for b in range(a + 1):
                total = np.float64(gram[support[kept[a]], support[kept[b]]]) + (RIDGE if a == b else 0.0)
                for i in range(b):
                    total -= factor[a, i] * factor[b, i]
                if a == b:
                    factor[a, a] = np.sqrt(max(total, RIDGE))
                else:
                    factor[a, b] = total / factor[b, b]
        _cholesky_solve(factor, kept_targets, size, scratch, solution)
        for j in range(live):
            values[j] = 0.0
        for a in range(size):
            values[kept[a]] = solution[a]
    for j in range(live):
        values[j] = max(values[j], 0.0)
