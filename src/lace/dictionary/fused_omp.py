"""Batch OMP on CPU fused row by row, compiled with numba.

The caller computes the correlations `X D^T` of a block of rows (one BLAS product, the
floor) and the Gram matrix `G = D D^T`. `omp_rows` then codes the block one row at a
time, so that the row's K correlations stay in the core's cache for all s steps instead
of s passes over the whole (B, K) block. Each step:
- selects the first atom with the largest correlation (or |correlation|) with the residual;
- grows the support's Cholesky factor by one row and refits the coefficients by least
  squares on the support (s x s triangular solves in float64), from the float32 Gram: G[I, k]
  (entries the exact recompute below has just read) and G[k, k] from a copy of the diagonal.
The coefficients depend only on the support and the float32 entries, so a kernel that picks the
same atoms gives the same codes to the bit.
The residual correlations are `X D^T - a_I G[I]`. They are kept in tiles of TILE atoms,
each up to date for the coefficients of some earlier step, and a tile is brought up to
date only when it could hold the step's largest entry: its largest stored entry plus
sum_j |change_j| max |G[k_j, tile]| (a bound, with margins for rounding and quantization) is
at least the least the largest up-to-date entry can be. The updates read int8 codes of G
(`quantized_gram`: a step per row, the diagonal left out), a quarter of the float32 Gram's
bytes (at K = 4096, 16 MB against 64); a stored entry is then within errors[v] (half a step
of each support atom's row times |its coefficient|) of the exact one, and the support atoms'
own entries are computed exactly from G[I, I]. The selection takes the largest stored entry,
recomputes exactly (float64, from the float32 Gram) every entry stored within twice that error
of it (the parts of PART atoms whose largest key reaches that far; about one entry per step on
the encode benchmark) and picks the largest exact one, ties to the lowest index: the atom a full
float32 update would pick, up to float32 rounding of near ties. Every array the compiled code
touches is a view that holds no reference (`_unowned`, `_view`): numba counts references of
arrays passed to compiled functions and of slices with atomic operations (7% of the previous
kernel's profile samples, 30% of this one's before the views). On the encode benchmark's 100,000
rows the codes equal the float32-Gram kernel's to the bit and the kernel is 7% faster (an idle
machine); of its time, a fifth waits on the exact recomputes' Gram entries, a fifth is the int8
updates and a tenth their prefetches (perf samples).

Filtered correlations (`omp_rows(..., filtered=FilteredProduct(...))`, from `bfloat16_filter`): the block's
correlations are a bfloat16 product within errors[0] (a bound per row) of the float32 product. Every bound above
then adds errors[0], and wherever the kernel needs an entry of the float32 product itself (the candidates of each
selection, the chosen atoms' targets, the support atoms' own entries) it forms it as oneMKL's sgemm does
(`sgemm_dots`: FMA chains over the inner blocks `sgemm_block` finds, in the order of the sum), so the codes are
those of the float32 product to the bit. A row's first selection forms at once the products of its atoms in the
SPECULATE parts of largest entries (later steps mostly choose among them; 8 chains at a time keep the FMA units
busy, one at a time waits on each FMA). On the encode benchmark a row forms about 14 products, 1.3 calls.

The algorithm, its stopping rules and the non-negative refit are those of
`sparse_coding._batch_omp`, which stays the kernel for other devices; the two give the
same supports and codes equal to float32 rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

TILE = 512  # atoms per tile of the residual correlations
PART = 64  # atoms per part of a tile: each part's largest key is kept, so a selection scans one part
CODE_LEVELS = 127  # the quantized Gram's codes: int8 in -127..127
LINE = 64  # bytes per cache line
# Shared with the torch kernel (`sparse_coding._batch_omp`), so that both stop and refit by the same rules:
RIDGE = 1e-6  # added to the diagonal of the non-negative refit's systems
DEPENDENT = 1e-7  # an atom whose squared distance to the support's span is below this share of its norm stops the row
# Reassociation and fused multiply-adds: maxima are exact in any order, and the tile
# updates' rounding (which the bounds' margin covers) changes by less than float32's own.
FAST_MATH = True
SPECULATE = 8  # parts whose atoms' products the first step forms (filtered correlations)
NONE = -1.0e300  # below every entry and bound; no infinities, which fast math assumes away


def _compiled(function, fastmath=FAST_MATH):
    """`function` compiled without the GIL, cached on disk when numba finds a writable cache
    directory (next to this file, else NUMBA_CACHE_DIR or the user's cache), else per process."""
    try:
        return numba.njit(nogil=True, fastmath=fastmath, cache=True)(function)
    except RuntimeError:  # no cache location is writable
        return numba.njit(nogil=True, fastmath=fastmath)(function)


def _inlined(function):
    """A helper of the compiled functions, inlined into each caller by numba: a call to a compiled function
    counts a reference to each array it is passed, with atomic operations that cost more than these helpers."""
    return numba.njit(inline="always", nogil=True, fastmath=FAST_MATH)(function)


def tile_maxima(gram: np.ndarray) -> np.ndarray:
    """(K, ceil(K / TILE)) largest |G[k, i]| over the atoms i of each tile, for the Gram matrix (K, K)."""
    n_atoms = gram.shape[0]
    maxima = np.empty((n_atoms, (n_atoms + TILE - 1) // TILE), dtype=gram.dtype)
    _tile_maxima(gram, maxima)
    return maxima


def quantized_gram(gram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Gram matrix (K, K) as int8 codes (K, K) and a step per row (K,), float64: G[k, i] ~ step[k] * codes[k, i]
    within step[k] / 2, off the diagonal; the diagonal's codes are 0 (the kernel computes those entries exactly)."""
    codes = np.empty(gram.shape, dtype=np.int8)
    steps = np.empty(gram.shape[0])
    _quantize(gram, codes, steps)
    return codes, steps


def omp_rows(
    correlations: np.ndarray,
    gram: np.ndarray,
    gram_diagonal: np.ndarray,
    gram_tile_maxima: np.ndarray,
    gram_codes: np.ndarray,
    gram_steps: np.ndarray,
    sparsity: int,
    nonnegative: bool,
    tiny: float,
    filtered: FilteredProduct | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """OMP codes of a block from its correlations (n, K) = X D^T, the Gram matrix (K, K),
    its diagonal (K,) (a contiguous copy), its `tile_maxima` (K, K / TILE) and its `quantized_gram`.

    `correlations` is read only. Rows stop early when the best correlation is at most
    `tiny` or the chosen atom lies in the span of the support; their remaining slots repeat
    the atom chosen at the stop with value 0. Returns indices (n, s) int64 and values
    (n, s) of the correlations' dtype.
    `filtered`: `correlations` are only within `filtered.errors` of the product, which the kernel forms exactly
    (as oneMKL's sgemm does, `sgemm_dots`) for the atoms it may choose; the codes are those of the product.
    """
    n = correlations.shape[0]
    indices = np.empty((n, sparsity), dtype=np.int64)
    values = np.empty((n, sparsity), dtype=correlations.dtype)
    # a tile update's rounding is at most (s + 1) float eps of the magnitudes it adds up
    margin = 4.0 * (sparsity + 1) * float(np.finfo(correlations.dtype).eps)
    if filtered is None:
        filtered = FilteredProduct(np.zeros((n, 1), dtype=np.float32), np.zeros((1, 1), dtype=np.float32), np.zeros(n), 0)
    _omp_rows(correlations, gram, gram_diagonal, gram_tile_maxima, gram_codes, gram_steps, sparsity, nonnegative,
              tiny, margin, indices, values, _workspace(correlations.shape[1], sparsity, correlations.dtype),
              filtered.rows, filtered.atoms, filtered.errors, filtered.block,
              _exact_workspace(correlations.shape[1], -(-filtered.rows.shape[1] // max(filtered.block, 1))))
    return indices, values


class FilteredProduct(NamedTuple):
    """What `omp_rows` needs when its correlations (n, K) only approximate the product X D^T: the rows X (n, d)
    and atoms D (K, d) (float32, contiguous), a bound on |approximate - product| per row (n,) float64, and the
    inner block of oneMKL's sgemm (`sgemm_block`); block 0: the correlations are the product itself."""

    rows: np.ndarray
    atoms: np.ndarray
    errors: np.ndarray
    block: int


def sgemm_block(rows: np.ndarray, atoms: np.ndarray, product: np.ndarray) -> int:
    """The inner block b for which `sgemm_dots` (FMA chains over b inner indices, summed) gives every entry of
    `product` (n, K) = rows (n, d) @ atoms (K, d)^T bit for bit, or 0 when no candidate does. oneMKL's float32
    product on AVX-512 accumulates each entry in one chain for d <= 384 and in blocks beyond (256 + 256 for
    d = 512, blocks of 384 for d = 768 and up)."""
    dim = rows.shape[1]
    columns = np.arange(product.shape[1], dtype=np.int64)
    candidates = [dim, *(-(-dim // parts) for parts in range(2, 9)), *(b for b in (384, 256, 192, 128) if b < dim)]
    dots = np.empty(columns.shape[0], dtype=np.float32)
    sums = np.empty(columns.shape[0] * dim, dtype=np.float32)  # a sum per atom and inner block
    for block in dict.fromkeys(candidates):
        if all(_matches(rows[i], atoms, columns, block, dots, sums, product[i]) for i in range(rows.shape[0])):
            return int(block)
    return 0


def _matches(row, atoms, columns, block, dots, sums, expected) -> bool:
    sgemm_dots(row, atoms, columns, columns.shape[0], block, dots, sums)
    return bool(np.array_equal(dots, expected))


def _workspace(n_atoms: int, sparsity: int, dtype: np.dtype) -> tuple[tuple, tuple]:
    """`_omp_rows`' scratch arrays, made here so that they outlive its views of them that hold no reference:
    (residual (K,) and weights (s,) of `dtype`; tile keys, part keys, tile versions (int64); support and kept
    slots (s,) int64) and (float64: tile bounds, history (s + 1, s) of the coefficients by version, errors
    (s + 1,) by version, Cholesky factor and G[I, I] (s, s), cross, targets, coefficients, scratch, kept targets
    (s,))."""
    n_tiles = (n_atoms + TILE - 1) // TILE
    integers = (np.empty(n_tiles, dtype=np.int64), np.empty((n_atoms + PART - 1) // PART, dtype=np.int64),
                np.empty(n_tiles, dtype=np.int64), np.empty(sparsity, dtype=np.int64), np.empty(sparsity, dtype=np.int64))
    floats = (np.empty(n_tiles), np.zeros((sparsity + 1, sparsity)), np.zeros(sparsity + 1),
              np.zeros((sparsity, sparsity)), np.empty((sparsity, sparsity)), *(np.zeros(sparsity) for _ in range(5)))
    return (np.empty(n_atoms, dtype=dtype), np.empty(sparsity, dtype=dtype), *integers), floats


def _exact_workspace(n_atoms: int, blocks: int) -> tuple:
    """`_omp_rows`' scratch for exact products: per atom the exact value (float64) and the row it was formed for
    (int64, -1: none); candidate atoms and those still to form (K,) int64; their products (K,) and the sums of
    their inner blocks (K * blocks,) float32 (`sgemm_dots`); scratch (K / PART,) int64 for part keys."""
    return (np.empty(n_atoms), np.full(n_atoms, -1, dtype=np.int64), np.empty(n_atoms, dtype=np.int64),
            np.empty(n_atoms, dtype=np.int64), np.empty(n_atoms, dtype=np.float32),
            np.empty(n_atoms * blocks, dtype=np.float32), np.empty((n_atoms + PART - 1) // PART, dtype=np.int64))


def _chains(function):
    """`function` compiled with contraction into fused multiply-adds but no reassociation: its sums keep the
    order they are written in."""
    return _compiled(function, fastmath={"contract"})


@_chains
def sgemm_dots(row, atoms, columns, count, block, dots, sums):
    """dots[j] = row (d,) . atoms[columns[j]] (d,) for j < count, float32, formed as oneMKL's sgemm forms an entry:
    one FMA chain from 0 over each `block` inner indices, the chains' results added in order. `sums` (>= count *
    ceil(d / block),) float32 is scratch. The chains of 8 atoms over one inner block run together, each in a
    register: one chain waits on its FMAs' latency, 8 keep the core's FMA units busy."""
    dim = row.shape[0]
    n_blocks = (dim + block - 1) // block
    for b in range(n_blocks):
        start = b * block
        stop = min(start + block, dim)
        inner = _view(row, 0, start, stop)
        for first in range(0, count, 8):
            last = min(first + 8, count) - 1
            a0 = _view(atoms, columns[first], start, stop)
            a1 = _view(atoms, columns[min(first + 1, last)], start, stop)
            a2 = _view(atoms, columns[min(first + 2, last)], start, stop)
            a3 = _view(atoms, columns[min(first + 3, last)], start, stop)
            a4 = _view(atoms, columns[min(first + 4, last)], start, stop)
            a5 = _view(atoms, columns[min(first + 5, last)], start, stop)
            a6 = _view(atoms, columns[min(first + 6, last)], start, stop)
            a7 = _view(atoms, columns[min(first + 7, last)], start, stop)
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
            for k in range(stop - start):
                value = inner[k]
                s0 += value * a0[k]
                s1 += value * a1[k]
                s2 += value * a2[k]
                s3 += value * a3[k]
                s4 += value * a4[k]
                s5 += value * a5[k]
                s6 += value * a6[k]
                s7 += value * a7[k]
            for lane, value in enumerate((s0, s1, s2, s3, s4, s5, s6, s7)):
                if first + lane <= last:
                    sums[(first + lane) * n_blocks + b] = value
    for j in range(count):
        total = sums[j * n_blocks]
        for b in range(1, n_blocks):
            total = total + sums[j * n_blocks + b]
        dots[j] = total


@_compiled
def _quantize(gram, codes, steps):
    n_atoms = gram.shape[0]
    like = gram[0, 0]
    for atom in range(n_atoms):
        row = _view(gram, atom, 0, n_atoms)
        largest = 0.0  # of |G[atom, i]| off the diagonal
        if atom > 0:
            largest = np.float64(_key_value(_largest_key(_view(row, 0, 0, atom), True), like))
        if atom + 1 < n_atoms:
            largest = max(largest, np.float64(_key_value(_largest_key(_view(row, 0, atom + 1, n_atoms), True), like)))
        steps[atom] = largest / CODE_LEVELS
        scale = CODE_LEVELS / largest if largest > 0.0 else 0.0
        for i in range(n_atoms):  # |G[atom, i]| * scale <= CODE_LEVELS off the diagonal; rounded to nearest
            codes[atom, i] = np.int8(np.floor(min(max(np.float64(row[i]) * scale, -CODE_LEVELS), CODE_LEVELS) + 0.5))
        codes[atom, atom] = 0


@_compiled
def _tile_maxima(gram, maxima):
    n_atoms = gram.shape[0]
    like = gram[0, 0]
    for atom in range(n_atoms):
        for tile in range(maxima.shape[1]):
            start = tile * TILE
            key = _largest_key(_view(gram, atom, start, min(start + TILE, n_atoms)), True)
            maxima[atom, tile] = _key_value(key, like)


@_compiled
def _omp_rows(correlations, gram, gram_diagonal, gram_tile_maxima, gram_codes, gram_steps, sparsity, nonnegative,
              tiny, margin, indices, values, workspace, rows, atoms, row_errors, block, exact_workspace):
    n_rows, n_atoms = correlations.shape
    absolute = not nonnegative
    # every array as a view that holds no reference (`_unowned`); the caller holds them all
    correlations, gram, gram_diagonal = _unowned(correlations), _unowned(gram), _unowned(gram_diagonal)
    gram_tile_maxima, gram_codes, gram_steps = _unowned(gram_tile_maxima), _unowned(gram_codes), _unowned(gram_steps)
    indices, values = _unowned(indices), _unowned(values)
    rows, atoms, row_errors = _unowned(rows), _unowned(atoms), _unowned(row_errors)
    residual, weights, tile_keys, part_keys, versions, support, kept = workspace[0]
    residual, weights, tile_keys, part_keys = _unowned(residual), _unowned(weights), _unowned(tile_keys), _unowned(part_keys)
    versions, support, kept = _unowned(versions), _unowned(support), _unowned(kept)
    bounds, history, errors, factor, support_gram, cross, targets, coefficients, scratch, kept_targets = workspace[1]
    bounds, history, errors, factor = _unowned(bounds), _unowned(history), _unowned(errors), _unowned(factor)
    support_gram, cross, targets = _unowned(support_gram), _unowned(cross), _unowned(targets)
    coefficients, scratch, kept_targets = _unowned(coefficients), _unowned(scratch), _unowned(kept_targets)
    exact = (_unowned(exact_workspace[0]), _unowned(exact_workspace[1]), _unowned(exact_workspace[2]),
             _unowned(exact_workspace[3]), _unowned(exact_workspace[4]), _unowned(exact_workspace[5]), atoms, block,
             _unowned(exact_workspace[6]))
    for row in range(n_rows):
        original = _view(correlations, row, 0, n_atoms)
        row_error = row_errors[row] if block else 0.0
        _largest_tile_keys(original, tile_keys, part_keys, absolute)
        # the largest |X D^T| of the row, for the updates' rounding (with absolute keys, the largest key's)
        scale_key = tile_keys.max() if absolute else np.int64(_largest_key(original, True))
        row_scale = np.float64(_key_value(scale_key, original[0])) + row_error
        versions[:] = 0
        coefficients[:] = 0.0
        errors[0] = row_error  # stored entries of version 0 are the correlations as given
        live = np.int64(0)  # not a literal 0: numba would also compile each callee it reaches for Literal[int](0)
        chosen = 0
        x = _view(rows, row, 0, rows.shape[1])
        for step in range(sparsity):
            if step:
                _update_candidate_tiles(
                    original, residual, support_gram, gram_tile_maxima, gram_codes, gram_steps, support, history,
                    errors, live, versions, tile_keys, part_keys, bounds, weights, absolute, margin, targets,
                )
            best, chosen = _select(original, residual, gram, support, history, errors, live, tile_keys, part_keys,
                                   versions, absolute, x, row, exact)
            if best <= tiny or not _grow_factor(factor, cross, gram, gram_diagonal, support, step, chosen, tiny):
                break
            support[step] = chosen
            _record_support_gram(support_gram, gram, gram_diagonal, support, step)
            targets[step] = exact[0][chosen] if block else original[chosen]
            live = step + 1
            _cholesky_solve(factor, targets, live, scratch, coefficients)
            for j in range(sparsity):
                history[live, j] = coefficients[j] if j < live else 0.0
            errors[live] = row_error + _quantization_error(history, support, live, gram_steps, row_scale, margin,
                                                           sparsity)
        last = support[live - 1] if live == sparsity else chosen
        for j in range(sparsity):
            indices[row, j] = support[j] if j < live else last
            values[row, j] = coefficients[j] if j < live else 0.0
        if nonnegative and live:
            _refit_nonnegative(_view(values, row, 0, sparsity), support, live, targets, gram, factor, scratch, coefficients, kept,
                               kept_targets)


@_inlined
def _quantization_error(history, support, live, gram_steps, row_scale, margin, sparsity):
    """Bound on |stored - exact| of a residual entry brought up to date with the quantized Gram for these
    coefficients: half a step of each support atom's codes times |its coefficient|, plus the updates' rounding
    (at most `sparsity` updates, each within `margin` of the magnitudes it adds up)."""
    quantization = 0.0
    magnitude = row_scale
    for j in range(live):
        quantization += 0.5 * abs(history[live, j]) * gram_steps[support[j]]
        magnitude += abs(history[live, j]) * (CODE_LEVELS + 1) * gram_steps[support[j]]
    return quantization * (1.0 + margin) + sparsity * margin * magnitude


@_inlined
def _record_support_gram(support_gram, gram, gram_diagonal, support, step):
    """support_gram[:step + 1, :step + 1] = G[I, I] with the atom support[step] added (entries `_grow_factor` has
    just read)."""
    atom = support[step]
    for j in range(step):
        support_gram[j, step] = support_gram[step, j] = gram[support[j], atom]
    support_gram[step, step] = gram_diagonal[atom]


@_inlined
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
def _view(typingctx, array, row, start, stop):
    """array[row, start:stop] (2-d `array`) or array[start:stop] (1-d, `row` ignored) as a 1-d view that holds
    no reference: numba counts the references of each slice it makes with atomic operations, which cost
    more than the kernel's short loops over them. The view must not outlive `array`."""
    view_type = types.Array(array.dtype, 1, "C")

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        source = context.make_array(array_type)(context, builder, args[0])
        first = [args[1], args[2]] if array_type.ndim == 2 else [args[2]]
        pointer = cgutils.get_item_pointer(context, builder, array_type, source, first)
        view = context.make_array(view_type)(context, builder)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(array.dtype)))
        populate_array(view, data=pointer, shape=[builder.sub(args[3], args[2])], strides=[itemsize],
                       itemsize=itemsize, meminfo=None)
        return view._getvalue()

    return view_type(array, types.intp, types.intp, types.intp), codegen


@intrinsic
def _unowned(typingctx, array):
    """`array` as a view that holds no reference (see `_view`); it must not outlive `array`."""

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        source = context.make_array(array_type)(context, builder, args[0])
        view = context.make_array(array_type)(context, builder)
        populate_array(view, data=source.data, shape=source.shape, strides=source.strides, itemsize=source.itemsize,
                       meminfo=None)
        return view._getvalue()

    return array(array), codegen


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


@_inlined
def _subtract_codes(target, weight, codes):
    """target -= weight * codes, for 1-d slices; `codes` int8 (a loop over slices vectorises where one
    over index ranges of larger arrays did not)."""
    for i in range(target.shape[0]):
        target[i] -= weight * codes[i]


@_inlined
def _largest_key(values, absolute):
    """The largest order key of a 1-d slice."""
    best = _order_key(values[0], absolute)
    for i in range(values.shape[0]):
        best = max(best, _order_key(values[i], absolute))
    return best


@_inlined
def _largest_tile_keys(values, tile_keys, part_keys, absolute):
    """tile_keys[c] = the largest order key of tile c of `values`; part_keys the same for each part."""
    for tile in range(tile_keys.shape[0]):
        tile_keys[tile] = _largest_part_keys(values, tile, part_keys, absolute)


@_inlined
def _largest_part_keys(values, tile, part_keys, absolute):
    """part_keys[p] = the largest order key of part p of `values`, for the parts of tile `tile`; returns their
    largest."""
    n_atoms = values.shape[0]
    first = tile * (TILE // PART)
    best = np.int64(_order_key(values[tile * TILE], absolute))
    for part in range(first, min(first + TILE // PART, part_keys.shape[0])):
        key = _largest_key(_view(values, 0, part * PART, min(part * PART + PART, n_atoms)), absolute)
        part_keys[part] = key
        best = max(best, key)
    return best


@_inlined
def _update_candidate_tiles(
    original, residual, support_gram, gram_tile_maxima, gram_codes, gram_steps, support, history, errors, live,
    versions, tile_keys, part_keys, bounds, weights, absolute, margin, targets,
):
    """Bring up to date (version `live`) every tile that could hold an entry at least the
    largest up-to-date one, largest bound first. A tile of version 0 is still in `original`.
    The updates read the quantized Gram (`gram_codes`); entries stored in a tile of version v are within
    errors[v] of the exact ones, and the bounds and the largest up-to-date entry allow for it."""
    like = residual[0]
    best = _bound_tiles(gram_tile_maxima, support, history, errors, live, versions, tile_keys, bounds, margin, like)
    # fetch every candidate tile's Gram slices at once: one at a time, each waits on memory
    for tile in range(bounds.shape[0]):
        if bounds[tile] >= best:
            start = tile * TILE
            stop = min(start + TILE, residual.shape[0])
            for j in range(versions[tile], live):  # the slices of atoms already in it were read before
                for i in range(start, stop, LINE):
                    _prefetch(gram_codes, support[j], i)
    while True:
        tile = 0
        for other in range(1, bounds.shape[0]):
            if bounds[other] > bounds[tile]:
                tile = other
        if bounds[tile] < best or bounds[tile] == NONE:
            return
        key = _update_tile(original, residual, support_gram, gram_codes, gram_steps, support, history, live,
                           versions[tile], tile, part_keys, weights, absolute, targets)
        tile_keys[tile] = key
        versions[tile] = live
        bounds[tile] = NONE
        best = max(best, np.float64(_key_value(key, like)) - errors[live])


@_inlined
def _bound_tiles(gram_tile_maxima, support, history, errors, live, versions, tile_keys, bounds, margin, like):
    """bounds[c] = the largest (|)entry(|) tile c could hold at version `live` (NONE for tiles already there);
    returns the least the largest entry of the up-to-date tiles can be (NONE when none is up to date)."""
    best = NONE
    for tile in range(tile_keys.shape[0]):
        stored = np.float64(_key_value(tile_keys[tile], like))
        version = versions[tile]
        if version == live:
            best = max(best, stored - errors[live])
            bounds[tile] = NONE
            continue
        spread = 0.0
        for j in range(live):
            spread += abs(history[live, j] - history[version, j]) * gram_tile_maxima[support[j], tile]
        bounds[tile] = stored + errors[version] + spread + margin * (abs(stored) + spread)
    return best


@_inlined
def _update_tile(original, residual, support_gram, gram_codes, gram_steps, support, history, live, version, tile, part_keys,
                 weights, absolute, targets):
    """Bring tile `tile` from `version` to `live` with the quantized Gram; the support atoms' own entries (the
    codes leave out the diagonal) are computed exactly, from their products `targets`. Returns the tile's largest
    order key."""
    start = tile * TILE
    stop = min(start + TILE, residual.shape[0])
    part = _view(residual, 0, start, stop)
    if version == 0:
        part[:] = _view(original, 0, start, stop)
    for j in range(live):
        weights[j] = (history[live, j] - history[version, j]) * gram_steps[support[j]]
    for j in range(live):
        if weights[j] != 0:
            _subtract_codes(part, weights[j], _view(gram_codes, support[j], start, stop))
    for j in range(live):
        if start <= support[j] < stop:
            entry = targets[j]
            for i in range(live):
                entry -= history[live, i] * support_gram[i, j]
            residual[support[j]] = entry
    return _largest_part_keys(residual, tile, part_keys, absolute)


@_inlined
def _exact(product, gram, support, history, live, atom):
    """The residual correlation of `atom`, X D^T - a_I G[I], in float64 from its product (X D^T)[atom] and the
    float32 Gram."""
    total = product
    for j in range(live):
        total -= history[live, j] * np.float64(gram[support[j], atom])
    return total


@_inlined
def _select(original, residual, gram, support, history, errors, live, tile_keys, part_keys, versions, absolute, x, row,
            exact):
    """(largest exact entry or |entry|, its first index). Entries stored within 2 errors[live] of the largest
    stored one are recomputed exactly (`_exact`); every other entry is smaller than the largest exact one. With
    approximate correlations (exact[7], the sgemm block, not 0) their products are formed exactly first."""
    if live == 0 and not exact[7]:
        return _first_largest(original, tile_keys, part_keys, absolute)
    like = residual[0]
    largest = NONE
    for tile in range(tile_keys.shape[0]):
        if versions[tile] == live:
            largest = max(largest, np.float64(_key_value(tile_keys[tile], like)))
    threshold = largest - 2.0 * errors[live]
    stored_values = residual if live else original
    # the first step also forms the products of the atoms of the SPECULATE largest parts: later steps mostly choose
    # among them, and products formed together share the core (`sgemm_dots`)
    reach = threshold if live else min(threshold, _kth_largest_key(part_keys, SPECULATE, exact[8], like))
    count = 0
    candidates = exact[2]
    for part in range(part_keys.shape[0]):
        if versions[part * PART // TILE] != live or np.float64(_key_value(part_keys[part], like)) < reach:
            continue
        for i in range(part * PART, min(part * PART + PART, residual.shape[0])):
            stored = np.float64(stored_values[i])
            if (abs(stored) if absolute else stored) >= reach:
                candidates[count] = i
                count += 1
    if exact[7]:
        _form_products(x, row, candidates, count, exact)
    best = NONE
    index = 0
    for c in range(count):
        i = candidates[c]
        stored = np.float64(stored_values[i])
        if (abs(stored) if absolute else stored) < threshold:
            continue
        product = exact[0][i] if exact[7] else np.float64(original[i])
        value = _exact(product, gram, support, history, live, i)
        score = abs(value) if absolute else value
        if score > best:
            best = score
            index = i
    return best, index


@_inlined
def _kth_largest_key(keys, k, scratch, like):
    """The k-th largest of the order keys `keys`, as a float of `like`'s type (the smallest key for k past them)."""
    count = keys.shape[0]
    for i in range(count):
        scratch[i] = keys[i]
    found = scratch[0]
    for _ in range(min(k, count)):
        position = 0
        for i in range(1, count):
            if scratch[i] > scratch[position]:
                position = i
        found = scratch[position]
        scratch[position] = np.iinfo(np.int64).min
    return np.float64(_key_value(found, like))


@_inlined
def _form_products(x, row, candidates, count, exact):
    """exact[0][a] = the product x . atoms[a] as oneMKL's sgemm forms it, for the `count` atoms of `candidates`
    not yet formed for `row` (exact[1][a] == row)."""
    values, formed, pending, dots, sums, atoms, block = exact[0], exact[1], exact[3], exact[4], exact[5], exact[6], exact[7]
    missing = 0
    for c in range(count):
        if formed[candidates[c]] != row:
            pending[missing] = candidates[c]
            missing += 1
    if missing:
        sgemm_dots(x, atoms, pending, missing, block, dots, sums)
        for c in range(missing):
            values[pending[c]] = np.float64(dots[c])
            formed[pending[c]] = row


@_inlined
def _first_largest(values, tile_keys, part_keys, absolute):
    """(largest entry or |entry| of `values`, every tile of which is of version 0, its first index)."""
    best = tile_keys[0]
    for tile in range(tile_keys.shape[0]):
        best = max(best, tile_keys[tile])
    part = 0
    while part < part_keys.shape[0] - 1 and part_keys[part] != best:
        part += 1
    index = part * PART
    last = min(index + PART, values.shape[0]) - 1
    while index < last and _order_key(values[index], absolute) != best:
        index += 1  # the bounds only matter for NaN, which matches nothing
    value = values[index]
    return (abs(value) if absolute else value), index


@_inlined
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


@_inlined
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
