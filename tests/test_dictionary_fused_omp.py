"""The fused CPU OMP kernel against the batched torch kernel: same supports, codes and errors."""

from __future__ import annotations

import pytest
import torch

from lace.dictionary import SparseCodes, decode, encode
from lace.dictionary.fused_omp import TILE, quantized_gram


def _unit_rows(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _planted(n: int, n_atoms: int, dim: int, sparsity: int, seed: int, dtype=torch.float32):
    """Unit rows, each a non-negative combination of `sparsity` random unit atoms plus noise
    (the benchmark's data, small)."""
    generator = torch.Generator().manual_seed(seed)
    atoms = _unit_rows(torch.randn(n_atoms, dim, generator=generator, dtype=dtype))
    support = torch.randint(n_atoms, (n, sparsity), generator=generator)
    weights = 0.5 + torch.rand(n, sparsity, generator=generator, dtype=dtype)
    x = torch.einsum("ns,nsd->nd", weights, atoms[support])
    x = x + 0.1 * x.norm(dim=1, keepdim=True) / dim**0.5 * torch.randn(n, dim, generator=generator, dtype=dtype)
    return _unit_rows(x), atoms


def _both(x, atoms, sparsity, nonnegative, **options) -> tuple[SparseCodes, SparseCodes]:
    fused = encode(x, atoms, sparsity, nonnegative=nonnegative, kernel="fused", **options)
    batched = encode(x, atoms, sparsity, nonnegative=nonnegative, kernel="torch", **options)
    return fused, batched


def _assert_same_codes(fused: SparseCodes, batched: SparseCodes, x, atoms, atol: float) -> None:
    """Same atoms in the used slots, in the same order; same values; same reconstruction error."""
    used = batched.values != 0
    assert torch.equal(fused.values != 0, used)
    assert torch.equal(fused.indices[used], batched.indices[used])
    torch.testing.assert_close(fused.values, batched.values, atol=atol, rtol=0)
    errors = [((x - decode(codes, atoms)) ** 2).sum(1) for codes in (fused, batched)]
    torch.testing.assert_close(errors[0], errors[1], atol=10 * atol, rtol=0)


@pytest.mark.parametrize("nonnegative", [False, True])
@pytest.mark.parametrize("n_atoms", [3 * TILE + 76, 4 * TILE])  # a short last tile; lanes of 128 in torch's scan
def test_fused_kernel_equals_torch_kernel_on_planted_data(n_atoms, nonnegative):
    x, atoms = _planted(400, n_atoms, 96, 8, seed=n_atoms)
    fused, batched = _both(x, atoms, 8, nonnegative, chunk_size=150)
    _assert_same_codes(fused, batched, x, atoms, atol=2e-5)


@pytest.mark.parametrize("nonnegative", [False, True])
def test_fused_kernel_equals_torch_kernel_where_the_quantized_gram_is_coarse(nonnegative):
    # 16 dimensions: atoms correlate up to ~0.9, so the int8 Gram's error (half a step, ~4e-3 per unit of
    # coefficient) is larger than the gaps between the leading residual correlations, and each step's atom
    # is decided among several candidates recomputed exactly
    generator = torch.Generator().manual_seed(11)
    atoms = _unit_rows(torch.randn(3 * TILE + 76, 16, generator=generator))
    x = _unit_rows(torch.randn(300, 16, generator=generator))
    fused, batched = _both(x, atoms, 6, nonnegative)
    _assert_same_codes(fused, batched, x, atoms, atol=2e-5)


def test_quantized_gram_is_within_half_a_step_off_the_diagonal():
    atoms = _unit_rows(torch.randn(300, 24, generator=torch.Generator().manual_seed(2)))
    gram = (atoms @ atoms.T).numpy()
    codes, steps = quantized_gram(gram)
    off_diagonal = ~torch.eye(300, dtype=torch.bool)
    error = torch.from_numpy(gram - steps[:, None] * codes).double().abs()
    assert (error[off_diagonal] <= torch.from_numpy(steps).unsqueeze(1).expand(300, 300)[off_diagonal] / 2 + 1e-7).all()
    assert (codes.diagonal() == 0).all() and abs(codes).max() == 127


@pytest.mark.slow
@pytest.mark.parametrize("nonnegative", [False, True])
def test_fused_kernel_equals_torch_kernel_on_noise_in_float64(nonnegative):
    # no planted structure: many coefficients come out negative, so the refit runs
    generator = torch.Generator().manual_seed(5)
    atoms = _unit_rows(torch.randn(3 * TILE, 40, generator=generator, dtype=torch.float64))
    x = torch.randn(200, 40, generator=generator, dtype=torch.float64)
    fused, batched = _both(x, atoms, 10, nonnegative)
    assert fused.values.dtype == torch.float64
    _assert_same_codes(fused, batched, x, atoms, atol=1e-5)


@pytest.mark.parametrize("nonnegative", [False, True])
def test_ties_go_to_the_lowest_atom_index(nonnegative):
    # basis atoms and integer rows: every correlation is exact, so ties are exact. Atom 3 (lane 3 of
    # the first 128) and atom 130 (lane 2 of the second) tie: a lane-first scan would take 130.
    atoms = torch.eye(256)
    x = torch.zeros(3, 256)
    x[0, [3, 130]] = 2.0
    x[1, [130, 3, 200]] = torch.tensor([-2.0, 2.0, 1.0])
    x[2, [7, 9]] = torch.tensor([-2.0, -2.0])  # a tie of negative correlations
    fused, batched = _both(x, atoms, 2, nonnegative)
    _assert_same_codes(fused, batched, x, atoms, atol=0.0)
    assert fused.indices[0].tolist() == [3, 130]
    assert fused.indices[1, 0] == 3
    assert fused.indices[1, 1] == (200 if nonnegative else 130)
    assert fused.indices[2].tolist() == [7, 9] if not nonnegative else (fused.values[2] == 0).all()


@pytest.mark.parametrize("nonnegative", [False, True])
def test_zero_rows_and_rows_without_positive_correlation_get_zero_codes(nonnegative):
    x, atoms = _planted(6, 300, 32, 3, seed=1)
    x[1] = 0.0
    x[4] = -atoms[:5].abs().sum(0)
    atoms = atoms.abs()  # every correlation of row 4 is negative
    fused, batched = _both(x, atoms, 4, nonnegative)
    _assert_same_codes(fused, batched, x, atoms, atol=2e-5)
    assert (fused.values[1] == 0).all()
    assert (fused.values[4] == 0).all() == nonnegative


@pytest.mark.parametrize("nonnegative", [False, True])
def test_more_steps_than_the_rank_stop_at_the_rank(nonnegative):
    # atoms in a 6-dimensional space: after 6 atoms the residual is zero and no atom adds anything.
    # float64: the sixth atom is picked by correlations of the order of the float32 rounding.
    generator = torch.Generator().manual_seed(3)
    atoms = _unit_rows(torch.randn(700, 6, generator=generator, dtype=torch.float64))
    x = torch.randn(50, 6, generator=generator, dtype=torch.float64)
    fused, batched = _both(x, atoms, 9, nonnegative)
    _assert_same_codes(fused, batched, x, atoms, atol=1e-6)
    assert ((fused.values != 0).sum(1) <= 6).all()


def test_sparsity_equal_to_the_number_of_atoms_and_duplicated_atoms():
    generator = torch.Generator().manual_seed(4)
    half = _unit_rows(torch.randn(5, 12, generator=generator, dtype=torch.float64))
    atoms = torch.cat([half, half])  # every atom twice: the copy of a chosen atom is never chosen
    x = torch.randn(30, 12, generator=generator, dtype=torch.float64)
    fused, batched = _both(x, atoms, 10, nonnegative=False)
    # an atom and its copy tie; which one a kernel takes depends on the last bits of the BLAS product
    # (the CPU's own kernel), so the two kernels must choose the same atoms, not the same copies
    same_atoms = [SparseCodes(codes.indices % 5, codes.values, n_atoms=5) for codes in (fused, batched)]
    _assert_same_codes(*same_atoms, x, half, atol=1e-6)
    for codes in (fused, batched):
        chosen = torch.where(codes.values != 0, codes.indices % 5, -1 - torch.arange(10))
        assert all(len(set(row.tolist())) == 10 for row in chosen)  # never an atom and its copy in one row
    assert ((fused.values != 0).sum(1) <= 5).all()


def test_the_kernel_is_checked():
    atoms = torch.eye(4)
    with pytest.raises(ValueError, match="kernel"):
        encode(torch.ones(1, 4), atoms, 2, kernel="numba")
    with pytest.raises(ValueError, match="kernel: 'fused' runs on CPU in float32 or float64"):
        encode(torch.ones(1, 4, dtype=torch.bfloat16), atoms.bfloat16(), 2, kernel="fused")
