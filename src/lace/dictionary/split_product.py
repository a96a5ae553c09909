"""The float32 product X D^T from three bfloat16 products, on CPUs with AMX.

A float32 matrix splits into two bfloat16 ones, hi = bf16(A) and lo = bf16(A - hi), with
|A - hi - lo| <= 2^-18 |A| entrywise. Then

    X D^T ~ X_hi D_hi^T + X_hi D_lo^T + X_lo D_hi^T = [X_hi, X_lo, X_hi] [D_hi, D_hi, D_lo]^T,

one (n, 3d) x (3d, K) bfloat16 product with float32 accumulation, whose entries differ from
the float32 product by at most about 2^-16 sum_i |x_i d_i| (the dropped X_lo D_lo^T and the
splitting), against float32's own rounding of about d 2^-24 sum_i |x_i d_i|; on unit rows the
two are of the same order (about 1e-6 and 3e-7 at most on `benchmarks/dictionary_encode.py`'s
data). With AMX's bfloat16 tiles the three products take 0.65-0.8 of the time of one float32
product (AVX-512) on this machine class; inside the encoder (benchmarks/dictionary_encode.py) the
split product saved 8-13% of the whole encode time (three runs, loaded machine). The fused OMP
kernel uses it when asked for (`encode(..., split_product=True)`, on a CPU where it is `supported()`);
by default it uses the float32 product, because the split product's rounding, of float32's order but not float32's,
changes the order in which near-tied atoms are chosen in a few rows (3 of 100,000 on the
benchmark's data: same atoms, codes within 1.3e-6).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

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
def _cpu_has_amx_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags


def supported() -> bool:
    """True where the split product runs: a CPU with AMX bfloat16 tiles and oneMKL's bfloat16 product in torch."""
    return torch.backends.mkl.is_available() and _cpu_has_amx_bf16() and gemm_bf16bf16f32() is not None


def split_rows(rows: Tensor, atoms_side: bool) -> Tensor:
    """(n, 3d) bfloat16 operand of the split product for float32 `rows` (n, d): [hi, hi, lo] for the
    atoms (`atoms_side`), [hi, lo, hi] for the rows coded."""
    high = rows.to(torch.bfloat16)
    low = (rows - high.float()).to(torch.bfloat16)
    parts = (high, high, low) if atoms_side else (high, low, high)
    return torch.cat(parts, dim=1).contiguous()


class SplitProduct:
    """rows @ atoms^T (n, K) float32 by the split product, for fixed float32 `atoms` (K, d) and blocks of
    at most `max_rows` rows: the atoms are split once, and the blocks' operand is written into one buffer
    (a fresh (n, 3d) tensor per block costs page faults). CPU only, one oneMKL call on torch's threads."""

    def __init__(self, atoms: Tensor, max_rows: int):
        if not supported():
            raise RuntimeError("split product: needs a CPU with AMX bfloat16 and oneMKL's cblas_gemm_bf16bf16f32 in "
                               "torch (see split_product.supported())")
        self.atoms = split_rows(atoms, atoms_side=True)  # (K, 3d)
        self.dim = atoms.shape[1]
        self.operand = torch.empty(max_rows, 3 * self.dim, dtype=torch.bfloat16)  # [hi, lo, hi] of a block
        self.high = torch.empty(max_rows, self.dim)  # hi in float32, for lo = rows - hi

    def __call__(self, rows: Tensor, out: Tensor) -> Tensor:
        """out (n, K) = rows (n, d) @ atoms^T; `out` contiguous."""
        n, dim = rows.shape
        n_atoms = self.atoms.shape[0]
        if dim != self.dim or n > self.operand.shape[0] or out.shape != (n, n_atoms) or not out.is_contiguous():
            raise ValueError(f"split product: expected rows (<= {self.operand.shape[0]}, {self.dim}) and a contiguous "
                             f"out (n, {n_atoms}), got {tuple(rows.shape)} and {tuple(out.shape)}")
        operand, high = self.operand[:n], self.high[:n]
        operand[:, :dim].copy_(rows)
        operand[:, 2 * dim :].copy_(operand[:, :dim])
        high.copy_(operand[:, :dim])
        operand[:, dim : 2 * dim].copy_(torch.sub(rows, high, out=high))
        width = 3 * dim
        gemm_bf16bf16f32()(_ROW_MAJOR, _NO_TRANSPOSE, _TRANSPOSE, n, n_atoms, width, 1.0, operand.data_ptr(),
                            width, self.atoms.data_ptr(), width, 0.0, out.data_ptr(), n_atoms)
        return out
