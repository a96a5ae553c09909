"""The split bfloat16 product (AMX CPUs): float32-level accuracy, and the parameter that turns it on."""

from __future__ import annotations

import pytest
import torch

from lace.dictionary import encode, sparse_coding, split_product


def _unit_rows(n: int, dim: int, seed: int) -> torch.Tensor:
    rows = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return rows / rows.norm(dim=1, keepdim=True)


@pytest.mark.skipif(not split_product.supported(), reason="needs AMX bfloat16 and oneMKL's bfloat16 product in torch")
def test_split_product_is_as_accurate_as_the_float32_product():
    rows, atoms = _unit_rows(300, 96, 1), _unit_rows(1100, 96, 2)
    exact = rows.double() @ atoms.double().T
    product = split_product.SplitProduct(atoms, max_rows=512)
    out = torch.empty(300, 1100)
    assert product(rows, out) is out
    error = (out.double() - exact).abs()
    scale = rows.abs().double() @ atoms.abs().double().T  # sum_i |x_i d_i|
    assert (error <= 2.0**-15 * scale).all()  # the module's bound, 2^-16 sum |x_i d_i|, with room
    float32_error = (rows @ atoms.T).double().sub(exact).abs().max()
    assert error.max() <= 20 * float32_error  # of float32's own order, not bfloat16's (2^-8)
    # a block of fewer rows than the buffer, written into a slice of a larger output
    block = torch.empty(7, 1100)
    torch.testing.assert_close(product(rows[:7], block), out[:7], atol=0, rtol=0)


def test_the_split_product_is_off_unless_encode_asks_for_it(monkeypatch):
    made = []

    class Counted(split_product.SplitProduct):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(split_product, "SplitProduct", Counted)
    monkeypatch.setattr(sparse_coding, "SplitProduct", Counted, raising=False)
    monkeypatch.setenv("LACE_SPLIT_PRODUCT", "1")  # the library reads no environment variable for it
    x, atoms = _unit_rows(20, 16, 1), _unit_rows(64, 16, 2)
    encode(x, atoms, 3, kernel="fused")
    assert made == []
    with pytest.raises(ValueError, match="split_product"):  # the torch kernel has no split product
        encode(x, atoms, 3, kernel="torch", split_product=True)
    if split_product.supported():
        encode(x, atoms, 3, kernel="fused", split_product=True)
        assert made == [1]


@pytest.mark.skipif(not split_product.supported(), reason="needs AMX bfloat16 and oneMKL's bfloat16 product in torch")
@pytest.mark.parametrize("nonnegative", [False, True])
def test_fused_codes_with_the_split_product_equal_the_float32_product_codes(nonnegative):
    generator = torch.Generator().manual_seed(7)
    atoms = _unit_rows(1100, 64, 8)
    support = torch.randint(1100, (300, 6), generator=generator)
    x = torch.einsum("ns,nsd->nd", 0.5 + torch.rand(300, 6, generator=generator), atoms[support])
    x = x + 0.01 * torch.randn(300, 64, generator=generator)
    float32 = encode(x, atoms, 6, nonnegative=nonnegative, kernel="fused")
    split = encode(x, atoms, 6, nonnegative=nonnegative, kernel="fused", split_product=True)
    assert torch.equal(split.indices, float32.indices)
    torch.testing.assert_close(split.values, float32.values, atol=1e-5, rtol=0)


@pytest.mark.skipif(not split_product.supported(), reason="needs AMX bfloat16 and oneMKL's bfloat16 product in torch")
def test_split_product_checks_shapes():
    product = split_product.SplitProduct(_unit_rows(16, 8, 4), max_rows=4)
    with pytest.raises(ValueError, match="split product: expected rows"):
        product(_unit_rows(5, 8, 5), torch.empty(5, 16))
