"""Batch OMP on CPU fused row by row, compiled with numba.

The caller computes the correlations `X D^T` of a block of rows (one BLAS product, the
floor) and the Gram matrix `G = D D^T`. `omp_rows` then codes the block one row at a
time, so that the row's K correlations stay in the core's cache for all s steps instead
of s passes over the whole (B, K) block. Each step:
- selects the first atom with the largest correlation (or |correlation|) with the residual;
- grows the support's Cholesky factor by one row and refits the coefficients by least
  squares on the support (s x s triangular solves in float64). The new row reads G[I, k], as
  the torch kernel does: entries of the support's Gram rows, which the tile updates have just
  read, rather than a first read of the chosen atom's row from memory; G[k, k] comes from a
  copy of the diagonal.
The residual correlations are `X D^T - a_I G[I]`. They are kept in tiles of TILE atoms,
each up to date for the coefficients of some earlier step, and a tile is brought up to
date (its slice of the support's Gram rows, times the change of the coefficients) only
when it could hold the step's largest entry: its largest stored entry plus
sum_j |change_j| max |G[k_j, tile]| (a bound, with a margin for rounding) is at least the
largest up-to-date entry. Tiles that cannot win stay stale, so every selection is the one
a full update would make, with fewer Gram reads (about half of the tile updates are skipped
on the encode benchmark); the selection reads one integer key per tile (see `_order_key`)
and one tile. Of what remains, about a third is waiting on memory for the Gram slices (at
K = 4096, G is 64 MB) and the rest is the updates' arithmetic; a bfloat16 copy of G for the
updates, with error bounds and exact recomputes of near ties, was slower (docs/results-history.md,
"Sparse coding toward the matrix-product floor").

The algorithm, its stopping rules and the non-negative refit are those of
`sparse_coding._batch_omp`, which stays the kernel for other devices; the two give the
same supports and codes equal to float32 rounding.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

TILE = 512  # atoms per tile of the residual correlations
LINE = 64  # bytes per cache line
# Shared with the torch kernel (`sparse_coding._batch_omp`), so that both stop and refit by the same rules:
RIDGE = 1e-6  # added to the diagonal of the non-negative refit's systems
DEPENDENT = 1e-7  # an atom whose squared distance to the support's span is below this share of its norm stops the row
# Reassociation and fused multiply-adds: maxima are exact in any order, and the tile
# updates' rounding (which the bounds' margin covers) changes by less than float32's own.
FAST_MATH = True
NONE = -1.0e300  # below every entry and bound; no infinities, which fast math assumes away


def _compiled(function):
    """`function` compiled without the GIL, cached on disk when numba finds a writable cache
    directory (next to this file, else NUMBA_CACHE_DIR or the user's cache), else per process."""
    try:
        return numba.njit(nogil=True, fastmath=FAST_MATH, cache=True)(function)
    except RuntimeError:  # no cache location is writable
        return numba.njit(nogil=True, fastmath=FAST_MATH)(function)


def tile_maxima(gram: np.ndarray) -> np.ndarray:
    """(K, ceil(K / TILE)) largest |G[k, i]| over the atoms i of each tile, for the Gram matrix (K, K)."""
    n_atoms = gram.shape[0]
    maxima = np.empty((n_atoms, (n_atoms + TILE - 1) // TILE), dtype=gram.dtype)
    _tile_maxima(gram, maxima)
    return maxima


def omp_rows(
    correlations: np.ndarray,
    gram: np.ndarray,
    gram_diagonal: np.ndarray,
    gram_tile_maxima: np.ndarray,
    sparsity: int,
    nonnegative: bool,
    tiny: float,
) -> tuple[np.ndarray, np.ndarray]:
    """OMP codes of a block from its correlations (n, K) = X D^T, the Gram matrix (K, K),
    its diagonal (K,) (a contiguous copy) and its `tile_maxima` (K, K / TILE).

    `correlations` is read only. Rows stop early when the best correlation is at most
    `tiny` or the chosen atom lies in the span of the support; their remaining slots repeat
    the atom chosen at the stop with value 0. Returns indices (n, s) int64 and values
    (n, s) of the correlations' dtype.
    """
    n = correlations.shape[0]
    indices = np.empty((n, sparsity), dtype=np.int64)
    values = np.empty((n, sparsity), dtype=correlations.dtype)
    # a tile update's rounding is at most (s + 1) float eps of the magnitudes it adds up
    margin = 4.0 * (sparsity + 1) * float(np.finfo(correlations.dtype).eps)
    _omp_rows(correlations, gram, gram_diagonal, gram_tile_maxima, sparsity, nonnegative, tiny, margin, indices,
              values)
    return indices, values


@_compiled
def _tile_maxima(gram, maxima):
    n_atoms = gram.shape[0]
    like = gram[0, 0]
    for atom in range(n_atoms):
        for tile in range(maxima.shape[1]):
            start = tile * TILE
            key = _largest_key(gram[atom, start : min(start + TILE, n_atoms)], True)
            maxima[atom, tile] = _key_value(key, like)


@_compiled
def _omp_rows(correlations, gram, gram_diagonal, gram_tile_maxima, sparsity, nonnegative, tiny, margin, indices,
              values):
    n_rows, n_atoms = correlations.shape
    n_tiles = gram_tile_maxima.shape[1]
    absolute = not nonnegative
    residual = np.empty(n_atoms, dtype=correlations.dtype)  # the row's residual correlations, by tile
    tile_keys = np.empty(n_tiles, dtype=np.int64)  # largest order key of each tile's stored entries
    versions = np.empty(n_tiles, dtype=np.int64)  # a tile holds X D^T - G[I_v]^T history[v] for v = its version
    bounds = np.empty(n_tiles)
    weights = np.empty(sparsity, dtype=correlations.dtype)  # change of each coefficient in a tile update
    history = np.zeros((sparsity + 1, sparsity))  # history[v]: coefficients of the first v support atoms
    factor = np.zeros((sparsity, sparsity))  # Cholesky factor L of G[I, I], lower triangular
    cross = np.empty(sparsity)  # w with L w = G[I, k]
    targets = np.empty(sparsity)  # x . d_i of the support atoms
    coefficients = np.zeros(sparsity)
    scratch = np.empty(sparsity)
    support = np.empty(sparsity, dtype=np.int64)
    kept = np.empty(sparsity, dtype=np.int64)  # the non-negative refit's kept support slots
    kept_targets = np.empty(sparsity)
    for row in range(n_rows):
        original = correlations[row]
        _largest_tile_keys(original, tile_keys, absolute)
        versions[:] = 0
        coefficients[:] = 0.0
        live = np.int64(0)  # not a literal 0: numba would also compile each callee it reaches for Literal[int](0)
        chosen = 0
        for step in range(sparsity):
            if step:
                _update_candidate_tiles(
                    original, residual, gram, gram_tile_maxima, support, history, live, versions, tile_keys, bounds,
                    weights, absolute, margin,
                )
            best, chosen = _first_largest(original if live == 0 else residual, tile_keys, versions, live, absolute)
            if best <= tiny or not _grow_factor(factor, cross, gram, gram_diagonal, support, step, chosen, tiny):
                break
            support[step] = chosen
            targets[step] = original[chosen]
            live = step + 1
            _cholesky_solve(factor, targets, live, scratch, coefficients)
            for j in range(sparsity):
                history[live, j] = coefficients[j] if j < live else 0.0
        last = support[live - 1] if live == sparsity else chosen
        for j in range(sparsity):
            indices[row, j] = support[j] if j < live else last
            values[row, j] = coefficients[j] if j < live else 0.0
        if nonnegative and live:
            _refit_nonnegative(values[row], support, live, targets, gram, factor, scratch, coefficients, kept,
                               kept_targets)


@_compiled
def _grow_factor(factor, cross, gram, gram_diagonal, support, step, chosen, tiny):
    """Add atom `chosen` as row `step` of the support's Cholesky factor; False (factor unchanged)
    when it lies in the span of the support (squared distance at most DEPENDENT of its norm)."""
    diagonal = np.float64(gram_diagonal[chosen])
    squared_distance = diagonal
    for j in range(step):  # forward substitution L w = G[I, k]
        total = np.float64(gram[support[j], chosen])
        for i in range(j):
            total -= factor[j, i] * cross[i]
        cross[j] = total / factor[j, j]
        squared_distance -= cross[j] * cross[j]
    if squared_distance <= DEPENDENT * diagonal:
        return False
    for j in range(step):
        factor[step, j] = cross[j]
    factor[step, step] = np.sqrt(max(squared_distance, tiny))
    return True


@intrinsic
def _order_key(typingctx, value, absolute):
    """An integer that orders like |value| (absolute) or value: the float's bits without the
    sign bit, or for negatives with all bits but the sign flipped. int32 for float32, int64
    for float64. Integer maxima vectorise where float ones do not here."""
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


@intrinsic
def _key_value(typingctx, key, like):
    """The float (of `like`'s type) whose order key is `key`: the key's transform is its own inverse."""
    width = like.bitwidth

    def codegen(context, builder, signature, args):
        integer = ir.IntType(width)
        bits = builder.trunc(args[0], integer) if width < 64 else args[0]
        magnitude = ir.Constant(integer, (1 << (width - 1)) - 1)
        negative_mask = builder.and_(builder.ashr(bits, ir.Constant(integer, width - 1)), magnitude)
        return builder.bitcast(builder.xor(bits, negative_mask), context.get_value_type(like))

    return like(types.int64, like), codegen


@intrinsic
def _prefetch(typingctx, matrix, row, column):
    """Ask the cache for the line holding matrix[row, column]; returns at once."""

    def codegen(context, builder, signature, args):
        matrix_type = signature.args[0]
        array = context.make_array(matrix_type)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, matrix_type, array, [args[1], args[2]])
        byte_pointer = builder.bitcast(pointer, ir.IntType(8).as_pointer())
        flag = ir.IntType(32)
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer.type, flag, flag, flag]), "llvm.prefetch.p0"
        )
        # read, keep in the outer cache levels (into L2, not L1: measured faster), data cache
        builder.call(prefetch, [byte_pointer, ir.Constant(flag, 0), ir.Constant(flag, 1), ir.Constant(flag, 1)])
        return context.get_dummy_value()

    return types.void(matrix, row, column), codegen


@_compiled
def _subtract(target, weight, source):
    """target -= weight * source, for 1-d slices (a loop over slices vectorises where one
    over index ranges of larger arrays did not)."""
    for i in range(target.shape[0]):
        target[i] -= weight * source[i]


@_compiled
def _largest_key(values, absolute):
    """The largest order key of a 1-d slice."""
    best = _order_key(values[0], absolute)
    for i in range(values.shape[0]):
        best = max(best, _order_key(values[i], absolute))
    return best


@_compiled
def _largest_tile_keys(values, tile_keys, absolute):
    """tile_keys[c] = the largest order key of tile c of `values`."""
    n_atoms = values.shape[0]
    for tile in range(tile_keys.shape[0]):
        start = tile * TILE
        tile_keys[tile] = _largest_key(values[start : min(start + TILE, n_atoms)], absolute)


@_compiled
def _update_candidate_tiles(
    original, residual, gram, gram_tile_maxima, support, history, live, versions, tile_keys, bounds, weights, absolute, margin
):
    """Bring up to date (version `live`) every tile that could hold an entry at least the
    largest up-to-date one, largest bound first. A tile of version 0 is still in `original`."""
    n_atoms = residual.shape[0]
    like = residual[0]
    best = NONE
    for tile in range(tile_keys.shape[0]):
        stored = np.float64(_key_value(tile_keys[tile], like))
        version = versions[tile]
        if version == live:
            best = max(best, stored)
            bounds[tile] = NONE
            continue
        spread = 0.0
        for j in range(live):
            spread += abs(history[live, j] - history[version, j]) * gram_tile_maxima[support[j], tile]
        bounds[tile] = stored + spread + margin * (abs(stored) + spread)
    # fetch every candidate tile's Gram slices at once: one at a time, each waits on memory
    line_entries = LINE // gram.itemsize
    for tile in range(bounds.shape[0]):
        if bounds[tile] >= best:
            start = tile * TILE
            stop = min(start + TILE, n_atoms)
            for j in range(versions[tile], live):  # the slices of atoms already in it were read before
                for i in range(start, stop, line_entries):
                    _prefetch(gram, support[j], i)
    while True:
        tile = 0
        for other in range(1, bounds.shape[0]):
            if bounds[other] > bounds[tile]:
                tile = other
        if bounds[tile] < best or bounds[tile] == NONE:
            return
        start = tile * TILE
        stop = min(start + TILE, n_atoms)
        version = versions[tile]
        if version == 0:
            residual[start:stop] = original[start:stop]
        for j in range(live):
            weights[j] = history[live, j] - history[version, j]
        for j in range(live):
            if weights[j] != 0:
                _subtract(residual[start:stop], weights[j], gram[support[j], start:stop])
        key = _largest_key(residual[start:stop], absolute)
        tile_keys[tile] = key
        versions[tile] = live
        bounds[tile] = NONE
        best = max(best, np.float64(_key_value(key, like)))


@_compiled
def _first_largest(residual, tile_keys, versions, live, absolute):
    """(largest entry or |entry| of the up-to-date tiles, its first index)."""
    best = tile_keys[0]
    found = False
    for tile in range(tile_keys.shape[0]):
        if versions[tile] == live and (not found or tile_keys[tile] > best):
            best = tile_keys[tile]
            found = True
    tile = 0
    while tile < tile_keys.shape[0] - 1 and (versions[tile] != live or tile_keys[tile] != best):
        tile += 1
    index = tile * TILE
    last = min(index + TILE, residual.shape[0]) - 1
    while index < last and _order_key(residual[index], absolute) != best:
        index += 1  # the bounds only matter for NaN, which matches nothing
    value = residual[index]
    return (abs(value) if absolute else value), index


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
def _refit_nonnegative(values, support, live, targets, gram, factor, scratch, solution, kept, kept_targets):
    """Drop negative coefficients of one row and refit the rest by least squares on the
    remaining support (ridge RIDGE), twice at most; then clamp at 0. `values` is updated in place;
    `kept` and `kept_targets` (s,) are scratch, allocated once per block rather than once per row."""
    for _ in range(2):
        size = np.int64(0)  # not the literal 0 (see `_omp_rows`)
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
