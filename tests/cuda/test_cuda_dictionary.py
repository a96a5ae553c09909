"""Sparse coding and dictionary fitting on each device against the CPU's result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lace.dictionary.concept_dictionary import ConceptDictionary
from lace.dictionary.sparse_coding import decode, encode
from tests.cuda.devices import DEVICES, exact_fp32


def synthetic(n: int, n_atoms: int, dim: int, sparsity: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, dim) unit rows, each a positive mix of `sparsity` of `n_atoms` random unit atoms plus a little noise."""
    generator = torch.Generator().manual_seed(seed)
    atoms = F.normalize(torch.randn(n_atoms, dim, generator=generator), dim=1)
    support = torch.randint(n_atoms, (n, sparsity), generator=generator)
    weights = 0.5 + torch.rand(n, sparsity, generator=generator)
    x = torch.einsum("ns,nsd->nd", weights, atoms[support]) + 0.02 * torch.randn(n, dim, generator=generator)
    return F.normalize(x, dim=1), atoms


@pytest.mark.parametrize("nonnegative", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_sparse_codes_on_the_device_match_the_cpu(device, nonnegative):
    x, atoms = synthetic(2000, 512, 64, 8)
    reference = encode(x, atoms, 8, nonnegative=nonnegative)  # the CPU's default kernel (fused, for K >= its bar)
    with exact_fp32():
        # the batched torch kernel, a GPU's default (on the CPU: against the compiled kernel)
        codes = encode(x.to(device), atoms.to(device), 8, nonnegative=nonnegative, kernel="torch")
    assert codes.values.device.type == device
    same_support = (codes.indices.cpu().sort(dim=1).values == reference.indices.sort(dim=1).values).all(dim=1)
    assert same_support.float().mean() >= 0.99  # ties at a selection step may go either way
    rebuilt, expected = decode(codes, atoms.to(device)).cpu(), decode(reference, atoms)
    torch.testing.assert_close(rebuilt[same_support], expected[same_support], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_a_dictionary_fitted_on_the_device_matches_the_cpu_one(device):
    images, _ = synthetic(1500, 96, 32, 4, seed=1)
    texts, _ = synthetic(1500, 96, 32, 4, seed=2)
    options = {"n_atoms": 64, "sparsity": 4, "batch_size": 256, "n_epochs": 2, "random_state": 0}
    reference = ConceptDictionary(**options).fit(images, texts)
    with exact_fp32():
        fitted = ConceptDictionary(**options, device=device).fit(images.to(device), texts.to(device))
        quality = fitted.quality(images, texts)
    assert fitted.atoms_.device.type == device
    expected = reference.quality(images, texts)
    for modality in ("image", "text"):
        assert quality[modality]["fvu"] == pytest.approx(expected[modality]["fvu"], rel=0.05, abs=0.01)
        assert quality[modality]["mean_l0"] == pytest.approx(expected[modality]["mean_l0"], abs=0.2)
    # the same atoms, up to the drift of an online fit: each atom's nearest CPU atom
    nearest = (fitted.atoms_.cpu() @ reference.atoms_.T).max(dim=1).values
    assert nearest.median() > 0.95


def test_the_fitted_tensors_are_copied_to_a_device_once_while_unchanged():
    images, _ = synthetic(300, 32, 16, 2, seed=1)
    dictionary = ConceptDictionary(n_atoms=16, sparsity=2, batch_size=128).fit(images, images)
    assert dictionary._on_device("atoms_", "cpu") is dictionary.atoms_  # already there: no copy
    # "meta" stands in for a GPU on any machine: a device other than the tensors' own
    first = dictionary._on_device("atoms_", "meta")
    assert first.device.type == "meta" and dictionary._on_device("atoms_", "meta") is first
    assert dictionary._mean("text", "meta") is dictionary._mean("text", "meta")
    dictionary.atoms_[0] = 0.0  # changed in place: copied again
    second = dictionary._on_device("atoms_", "meta")
    assert second is not first and dictionary._on_device("atoms_", "meta") is second
    dictionary.atoms_ = dictionary.atoms_.clone()  # replaced: copied again
    assert dictionary._on_device("atoms_", "meta") is not second
