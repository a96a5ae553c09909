"""The device parameter of the tests in tests/cuda: every test body runs on "cpu" here (so the test code itself
is exercised on every machine) and on "cuda" where a GPU is present (`pytest -m cuda` runs those alone).

Tolerances, fp32 on a GPU against the CPU (TF32 off: `exact_fp32`):
- losses: relative 1e-4;
- gradients: each parameter's gradient within 1e-3 of the CPU's in norm, relative to the CPU gradient's norm
  (reductions run in another order on the GPU, and a loss of B x (B + M) logits sums many of them).
In bf16 autocast only finiteness is asserted (bf16 keeps 8 bits of mantissa).
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")])
DEVICES = ["cpu", CUDA]

LOSS_RTOL = 1e-4
GRADIENT_RTOL = 1e-3


@contextmanager
def exact_fp32():
    """fp32 matrix products and convolutions in full precision on the GPU (TF32 off), as on the CPU."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def assert_gradients_close(gradients: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
                           rtol: float = GRADIENT_RTOL) -> None:
    """Every parameter's gradient within `rtol` of the reference's, in norm relative to the reference's norm."""
    assert gradients.keys() == reference.keys()
    far = {}
    for name, expected in reference.items():
        gap = float((gradients[name] - expected).norm())
        scale = float(expected.norm())
        if gap > rtol * scale + 1e-7:  # the floor: a gradient that is zero on the CPU
            far[name] = (gap, scale)
    assert not far, f"gradients farther than {rtol} (relative) from the CPU's: {far}"
