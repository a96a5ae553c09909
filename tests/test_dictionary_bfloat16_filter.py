"""The bfloat16 filter of the fused OMP kernel (AMX CPUs): its error bound holds, its exact entries are the float32
product's to the bit, and the codes it gives are those of the float32 product, to the bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lace.dictionary import encode, fused_omp, sparse_coding
from lace.dictionary.bfloat16_filter import MIN_ROWS, FilterProduct, sgemm_block, supported

needs_filter = pytest.mark.skipif(not supported(), reason="needs AMX bfloat16 and oneMKL's bfloat16 product in torch")


def _unit_rows(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-30)


def _planted(n: int, n_atoms: int, dim: int, sparsity: int, seed: int):
    """Unit rows, each a non-negative combination of `sparsity` random unit atoms plus noise (the encode
    benchmark's data, small)."""
    generator = torch.Generator().manual_seed(seed)
    atoms = _unit_rows(torch.randn(n_atoms, dim, generator=generator))
    support = torch.randint(n_atoms, (n, sparsity), generator=generator)
    x = torch.einsum("ns,nsd->nd", 0.5 + torch.rand(n, sparsity, generator=generator), atoms[support])
    x = x + 0.1 * x.norm(dim=1, keepdim=True) / dim**0.5 * torch.randn(n, dim, generator=generator)
    return _unit_rows(x), atoms


def _with_and_without_filter(monkeypatch, x, atoms, sparsity, nonnegative, **options):
    made = []

    class Counted(FilterProduct):
        def __call__(self, rows, out):
            filtered = super().__call__(rows, out)
            made.append(filtered is not None)
            return filtered

    monkeypatch.setattr(sparse_coding, "FilterProduct", Counted)
    filtered = encode(x, atoms, sparsity, nonnegative=nonnegative, kernel="fused", **options)
    monkeypatch.setattr(sparse_coding, "FILTER_PRODUCT", False)
    plain = encode(x, atoms, sparsity, nonnegative=nonnegative, kernel="fused", **options)
    return filtered, plain, made


def _assert_identical(filtered, plain) -> None:
    assert torch.equal(filtered.indices, plain.indices)
    assert torch.equal(filtered.values, plain.values)


@needs_filter
@pytest.mark.parametrize("dim", [24, 96, 512])
def test_exact_entries_are_the_float32_products_bits(dim):
    generator = torch.Generator().manual_seed(dim)
    rows, atoms = torch.randn(40, dim, generator=generator), torch.randn(300, dim, generator=generator)
    block = sgemm_block(dim, 300)
    assert block > 0
    product = (rows @ atoms.T).numpy()
    columns = np.array([0, 7, 299, 150, 3, 3, 42, 8, 9, 10, 11], dtype=np.int64)
    dots = np.empty(columns.shape[0], dtype=np.float32)
    sums = np.empty(columns.shape[0] * dim, dtype=np.float32)
    for i in range(rows.shape[0]):
        fused_omp.sgemm_dots(rows[i].numpy(), atoms.numpy(), columns, columns.shape[0], block, dots, sums)
        assert np.array_equal(dots, product[i, columns])


@needs_filter
@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 1e12])
def test_the_error_bound_holds(scale):
    generator = torch.Generator().manual_seed(1)
    atoms = torch.randn(700, 64, generator=generator) * torch.rand(700, 1, generator=generator)
    rows = scale * torch.randn(MIN_ROWS + 9, 64, generator=generator)
    rows[3] = 0.0
    rows[5, :40] = 0.0
    out = torch.empty(rows.shape[0], 700)
    filtered = FilterProduct(atoms, rows.shape[0])(rows, out)
    gap = (out.double() - (rows @ atoms.T).double()).abs().amax(dim=1)
    assert (gap <= torch.from_numpy(filtered.errors)).all()
    if scale >= 1e-3:  # and the bound is of bfloat16's order, not vacuous (tiny rows: a fixed slack dominates)
        reach = 2.0**-6 * rows.norm(dim=1).double() * float(atoms.norm(dim=1).max())
        assert (torch.from_numpy(filtered.errors)[3 + 1 :] < reach[3 + 1 :]).all()


@needs_filter
@pytest.mark.parametrize("nonnegative", [False, True])
def test_codes_equal_the_float32_products_codes_on_planted_data(monkeypatch, nonnegative):
    x, atoms = _planted(700, 3 * fused_omp.TILE + 76, 96, 8, seed=2)
    filtered, plain, made = _with_and_without_filter(monkeypatch, x, atoms, 8, nonnegative, chunk_size=300)
    assert made == [True] * 5  # 256 and 44 rows of each block of 300, then the last 100
    _assert_identical(filtered, plain)


@needs_filter
@pytest.mark.parametrize("nonnegative", [False, True])
def test_codes_equal_the_float32_products_codes_where_the_filter_is_coarse(monkeypatch, nonnegative):
    # 16 dimensions and rows of every scale: many atoms lie within the filter's error of the best at each step
    generator = torch.Generator().manual_seed(11)
    atoms = _unit_rows(torch.randn(3 * fused_omp.TILE + 76, 16, generator=generator))
    x = torch.randn(300, 16, generator=generator) * 10.0 ** torch.randint(-15, 13, (300, 1), generator=generator)
    x[7] = 0.0
    x[8] = -atoms[:5].sum(0)
    filtered, plain, made = _with_and_without_filter(monkeypatch, x, atoms, 6, nonnegative)
    assert made == [True, True]  # 256 rows, then 44
    _assert_identical(filtered, plain)


@needs_filter
def test_blocks_the_filter_cannot_take_keep_the_float32_product(monkeypatch):
    x, atoms = _planted(2 * MIN_ROWS + 5, 1100, 32, 4, seed=3)
    x[MIN_ROWS + 2, 5] = float("nan")  # the second block is not finite; the third is too small
    filtered, plain, made = _with_and_without_filter(monkeypatch, x, atoms, 4, False, chunk_size=MIN_ROWS)
    assert made == [True, False, False]
    assert torch.equal(filtered.indices, plain.indices)
    torch.testing.assert_close(filtered.values, plain.values, rtol=0, atol=0, equal_nan=True)
