"""The fused OMP kernel's product X D^T as one bfloat16 product (AMX) that only filters candidates.

The float32 product X D^T is one (n, d) x (d, K) product per block of rows: on this machine class oneMKL's
AVX-512 sgemm, which the rest of the encode can only match, not beat. The kernel needs the exact float32 entries
only for atoms that might be chosen: the arg-max of each step and the entries within the errors of it. So the block
is first multiplied in bfloat16, hi(X) hi(D)^T (oneMKL's cblas_gemm_bf16bf16f32 on AMX tiles, float32 output,
about a quarter of the float32 product's time), with a bound per row on its distance to the float32 product:

    |hi(x) . hi(d) - x . d| <= |hi(x) - x| |d| + |hi(x)| |hi(d) - d|        (Cauchy-Schwarz)

plus the float32 rounding of both products (d 2^-24 of |x| |d| each, counted twice) and the flushing of
subnormal numbers. The kernel (`fused_omp.omp_rows` with a `FilteredProduct`) then forms the float32 entries of
its candidates exactly as oneMKL's sgemm forms them (`fused_omp.sgemm_dots`: FMA chains over the inner blocks that
`fused_omp.sgemm_block` finds oneMKL to use), so the codes are those of the float32 product, to the bit.

`FilterProduct.usable` is False (and `encode` keeps the float32 product) where the CPU lacks AMX or no inner
blocking reproduces oneMKL's sgemm on a probe of the same dictionary size. The codes equal the float32 product's
as long as oneMKL forms each entry of a block of at least MIN_ROWS rows as it does on the probe (PROBE_ROWS rows,
every atom): the inner blocking it shows does not depend on the number of rows or atoms (checked for 16 to 1024
rows, 300 to 4096 atoms, d from 16 to 1536; blocks of fewer rows take another path and keep the float32 product),
and on the encode benchmark's 100,000 rows no code differs in a bit. On that benchmark (one thread, this machine
class, loaded) the whole encode took 1.27-1.42 times the float32 product alone, against 1.80-1.96 with the float32
product, in the same processes: the product went from about 1.1 to 0.35-0.45 of the float32 product's time, and
the kernel spends about 5 us a row more on forming float32 entries (about 14 a row, most of it fetching the atoms).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from lace.dictionary import fused_omp

BLOCK_ROWS = 256  # rows per product and kernel call: their 4 MB of correlations are still in the caches when read
MIN_ROWS = 32  # smaller blocks keep the float32 product: oneMKL's sgemm takes another path for a few rows
PROBE_ROWS = 32
LARGEST = 2.0**50  # rows longer than this keep the float32 product (their squares' sums stay in float32's range)
SLACK = 1.01  # on the bound: the norms' rounding
_ROW_MAJOR, _NO_TRANSPOSE, _TRANSPOSE = 101, 111, 112  # CBLAS enums


@functools.cache
def gemm_bf16bf16f32():
    """oneMKL's C = alpha A B^T + beta C for bfloat16 A, B and float32 C, from the oneMKL that torch
    links (LP64: 32-bit sizes), or None when torch's library does not export it."""
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        function = ctypes.CDLL(str(library)).cblas_gemm_bf16bf16f32
    except (OSError, AttributeError):
        return None
    size = ctypes.c_int
    function.restype = None
    function.argtypes = [size, size, size, size, size, size, ctypes.c_float, ctypes.c_void_p, size,
                         ctypes.c_void_p, size, ctypes.c_float, ctypes.c_void_p, size]
    return function


@functools.cache
def supported() -> bool:
    """True where the filter's product runs: a CPU with AMX bfloat16 tiles and oneMKL's bfloat16 product in torch."""
    try:
        amx = " amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return amx and torch.backends.mkl.is_available() and gemm_bf16bf16f32() is not None


@functools.cache
def sgemm_block(dim: int, n_atoms: int) -> int:
    """The inner block of oneMKL's float32 product for (rows, d) x (d, K) products (`fused_omp.sgemm_block`), found
    on a random probe of PROBE_ROWS rows; 0 when no candidate reproduces it. Cached per shape."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(PROBE_ROWS, dim, generator=generator)
    atoms = torch.randn(n_atoms, dim, generator=generator)
    return fused_omp.sgemm_block(rows.numpy(), atoms.numpy(), (rows @ atoms.T).numpy())


class FilterProduct:
    """The bfloat16 product of blocks of at most `max_rows` rows with fixed float32 `atoms` (K, d), with its error
    bound per row (`fused_omp.FilteredProduct`)."""

    def __init__(self, atoms: Tensor, max_rows: int):
        self.block = (sgemm_block(atoms.shape[1], atoms.shape[0])
                      if supported() and atoms.dtype == torch.float32 and atoms.device.type == "cpu"
                      and float(torch.linalg.vector_norm(atoms, dim=1).max()) <= LARGEST else 0)
        self.usable = self.block > 0
        if not self.usable:
            return
        self.atoms = atoms.detach().contiguous()
        self.high_atoms = self.atoms.to(torch.bfloat16)  # (K, d)
        self.high_rows = torch.empty(max_rows, atoms.shape[1], dtype=torch.bfloat16)
        wide_atoms, wide_high = self.atoms.double(), self.high_atoms.double()
        self.atom_norm = float(wide_atoms.norm(dim=1).max())  # largest |d|, |hi(d)|, |hi(d) - d| over the atoms
        self.high_atom_norm = float(wide_high.norm(dim=1).max())
        self.atom_rounding = float((wide_atoms - wide_high).norm(dim=1).max())
        self.atom_largest = float(self.atoms.abs().max())
        dim = atoms.shape[1]
        self.gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)  # float32 sums of d terms

    def __call__(self, rows: Tensor, out: Tensor) -> fused_omp.FilteredProduct | None:
        """Write the bfloat16 product of `rows` (n, d) into `out` (n, K) and return what the kernel needs with
        it; None (nothing written) where the block is too small or has rows longer than LARGEST or not finite."""
        n, dim = rows.shape
        if n < MIN_ROWS:
            return None
        rows = rows.detach().contiguous()
        row_norm = torch.linalg.vector_norm(rows, dim=1)  # (n,); NaN or inf where an entry is
        if not float(row_norm.max()) <= LARGEST:
            return None
        high = self.high_rows[:n]
        high.copy_(rows)
        rounding = torch.linalg.vector_norm(rows - high.float(), dim=1)  # |hi(x) - x| (n,), exact differences
        row_norm, rounding = row_norm.double(), rounding.double()
        high_norm = row_norm + rounding  # >= |hi(x)|
        errors = SLACK * (rounding * self.atom_norm + high_norm * self.atom_rounding
                          + 2 * self.gamma * (high_norm * self.high_atom_norm + row_norm * self.atom_norm))
        # squares below float32's range lost from the norms (2^-58 at most), and subnormal inputs, products and
        # outputs flushed to 0 by the bfloat16 product
        errors += 2.0**-58 * (self.atom_norm + self.high_atom_norm) + dim * 2.0**-120 * (row_norm + self.atom_largest + 1)
        n_atoms = self.atoms.shape[0]
        gemm_bf16bf16f32()(_ROW_MAJOR, _NO_TRANSPOSE, _TRANSPOSE, n, n_atoms, dim, 1.0, high.data_ptr(), dim,
                           self.high_atoms.data_ptr(), dim, 0.0, out.data_ptr(), n_atoms)
        return fused_omp.FilteredProduct(rows.numpy(), self.atoms.numpy(), errors.numpy(), self.block)
