"""Sparse-coding kernels and the ConceptDictionary estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import orthogonal_mp_gram

from lace.dictionary import ConceptDictionary, decode, encode
from lace.errors import LaceInputError
from tests.toy_concepts import toy_directions, toy_embeddings


def _unit_rows(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.norm(dim=1, keepdim=True)


def _sparse_data(n: int, n_true: int = 48, dim: int = 24, k: int = 3, seed: int = 0):
    """Rows that are k-sparse non-negative combinations of a ground-truth dictionary, plus noise."""
    generator = torch.Generator().manual_seed(seed)
    true_atoms = _unit_rows(torch.randn(n_true, dim, generator=generator))
    support = torch.rand(n, n_true, generator=generator).argsort(1)[:, :k]
    codes = torch.zeros(n, n_true).scatter_(1, support, 0.5 + torch.rand(n, k, generator=generator))
    x = codes @ true_atoms + 0.02 * torch.randn(n, dim, generator=generator)
    return _unit_rows(x), true_atoms


def test_omp_matches_scikit_learn_when_signs_are_free():
    generator = torch.Generator().manual_seed(0)
    atoms = _unit_rows(torch.randn(64, 32, generator=generator, dtype=torch.float64))
    x = torch.randn(150, 32, generator=generator, dtype=torch.float64)
    codes = encode(x, atoms, 6, method="omp", nonnegative=False, dense=True, chunk_size=40)
    reference = orthogonal_mp_gram((atoms @ atoms.T).numpy(), (atoms @ x.T).numpy(), n_nonzero_coefs=6).T
    torch.testing.assert_close(codes, torch.from_numpy(reference), atol=1e-9, rtol=1e-7)


def test_omp_matches_scikit_learn_through_the_lane_scan_and_any_block_size():
    # K a multiple of the scan's lane width takes the vectorised arg-max; blocks of 7 and 1000 agree
    generator = torch.Generator().manual_seed(1)
    atoms = _unit_rows(torch.randn(256, 48, generator=generator, dtype=torch.float64))
    x = torch.randn(90, 48, generator=generator, dtype=torch.float64)
    reference = orthogonal_mp_gram((atoms @ atoms.T).numpy(), (atoms @ x.T).numpy(), n_nonzero_coefs=8).T
    for block in (7, 1000):
        codes = encode(x, atoms, 8, nonnegative=False, dense=True, chunk_size=block)
        torch.testing.assert_close(codes, torch.from_numpy(reference), atol=1e-9, rtol=1e-7)


def test_omp_with_duplicated_atoms_stops_when_the_residual_vanishes():
    # every atom twice: a row equal to an atom is coded by one copy and stops; another matches scikit-learn
    generator = torch.Generator().manual_seed(2)
    half = _unit_rows(torch.randn(128, 16, generator=generator, dtype=torch.float64))
    atoms = torch.cat([half, half])
    x = 0.8 * half[3] + 0.05 * _unit_rows(torch.randn(1, 16, generator=generator, dtype=torch.float64))[0]
    codes = encode(torch.stack([half[3], x]), atoms, 4, nonnegative=False, dense=True)
    assert torch.isfinite(codes).all()
    assert (codes[0] != 0).sum() == 1 and torch.isclose(codes[0].sum(), torch.tensor(1.0, dtype=codes.dtype))
    reference = orthogonal_mp_gram((atoms @ atoms.T).numpy(), (atoms @ x).numpy()[:, None], n_nonzero_coefs=4).T
    assert np.allclose(decode(codes[1:], atoms).numpy(), reference @ atoms.numpy(), atol=1e-8)


def test_nonnegative_omp_codes_are_sparse_nonnegative_and_least_squares_on_support():
    x, atoms = _sparse_data(200)
    codes = encode(x, atoms, 5, dense=True)
    assert (codes >= 0).all()
    assert ((codes > 0).sum(1) <= 5).all()
    # on its support each code is the least-squares fit (positive entries are unconstrained optima)
    for row in range(0, 200, 37):
        support = codes[row].nonzero().squeeze(1)
        solution = torch.linalg.lstsq(atoms[support].T, x[row].unsqueeze(1)).solution.squeeze(1)
        if (solution > 0).all():
            torch.testing.assert_close(codes[row, support], solution, atol=1e-4, rtol=1e-4)
    # structured data: non-negative OMP finds the true support, so the error is at the noise level
    error = ((x - decode(codes, atoms)) ** 2).sum(1).mean()
    assert error < 0.01


def test_topk_and_sparse_decode_agree_with_dense():
    x, atoms = _sparse_data(100)
    sparse = encode(x, atoms, 4, method="topk")
    assert sparse.indices.shape == (100, 4)
    torch.testing.assert_close(decode(sparse, atoms), decode(sparse.to_dense(), atoms))
    assert (sparse.values >= 0).all()


def test_learned_dictionary_recovers_ground_truth_atoms():
    x, true_atoms = _sparse_data(6000, seed=1)
    half = x.shape[0] // 2
    dictionary = ConceptDictionary(n_atoms=64, sparsity=3, batch_size=512, n_epochs=3, random_state=0)
    dictionary.fit(x[:half], x[half:])
    quality = dictionary.quality(x[:half], x[half:])
    assert quality["image"]["fvu"] < 0.1 and quality["text"]["fvu"] < 0.1
    assert quality["image"]["mean_cosine"] > 0.95
    assert quality["image"]["mean_l0"] <= 3
    best = (true_atoms @ dictionary.atoms_.T).max(1).values
    assert (best > 0.9).float().mean() > 0.9


def test_streaming_fit_from_memory_map_equals_in_memory_fit(tmp_path):
    directions = toy_directions()
    images = toy_embeddings(directions, 700, 2.0, seed=1)
    texts = toy_embeddings(directions, 900, -2.0, seed=2)
    np.save(tmp_path / "images.npy", images.numpy())
    np.save(tmp_path / "texts.npy", texts.numpy())
    params = {"n_atoms": 16, "sparsity": 4, "batch_size": 256, "n_epochs": 2, "chunk_size": 100, "random_state": 3}
    in_memory = ConceptDictionary(**params).fit(images.numpy(), texts.numpy())
    streamed = ConceptDictionary(**params).fit(tmp_path / "images.npy", str(tmp_path / "texts.npy"))
    torch.testing.assert_close(streamed.atoms_, in_memory.atoms_)
    torch.testing.assert_close(streamed.mean_image_, images.mean(0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(streamed.mean_text_, in_memory.mean_text_)


def test_unedited_codes_rebuild_the_input_exactly():
    directions = toy_directions()
    images = toy_embeddings(directions, 300, 2.0, seed=1)
    texts = toy_embeddings(directions, 300, -2.0, seed=2)
    dictionary = ConceptDictionary(n_atoms=16, sparsity=4, batch_size=128).fit(images, texts)
    for modality, z in (("image", images), ("text", texts)):
        encoded = dictionary.encode_embeddings(z, modality)
        rebuilt = dictionary.inverse_transform(encoded.codes, modality, encoded.residual, encoded.norm)
        torch.testing.assert_close(rebuilt, z, atol=1e-5, rtol=1e-5)
        # without the residual the direction is only approximate, but still close
        approximate = dictionary.inverse_transform(encoded.codes, modality)
        assert (approximate * z).sum(1).mean() > 0.8


def test_save_load_round_trip(tmp_path):
    directions = toy_directions()
    images = toy_embeddings(directions, 200, 2.0, seed=1)
    texts = toy_embeddings(directions, 200, -2.0, seed=2)
    dictionary = ConceptDictionary(n_atoms=12, sparsity=3, batch_size=100).fit(images, texts)
    dictionary.quality(images, texts)
    dictionary.save(tmp_path / "dict")
    assert sorted(p.name for p in (tmp_path / "dict").iterdir()) == ["cfg.json", "dictionary.safetensors", "manifest.json",
                                                                      "quality.json"]
    loaded = ConceptDictionary.load(tmp_path / "dict")
    torch.testing.assert_close(loaded.atoms_, dictionary.atoms_)
    assert loaded.get_params() == dictionary.get_params()
    assert loaded.quality_ == dictionary.quality_
    torch.testing.assert_close(loaded.transform(texts, "text", dense=True), dictionary.transform(texts, "text", dense=True))


def test_vocabulary_mode_uses_concept_directions_as_atoms():
    directions = toy_directions()
    images = toy_embeddings(directions, 200, 2.0, seed=1)
    texts = toy_embeddings(directions, 200, -2.0, seed=2)
    dictionary = ConceptDictionary(mode="vocabulary", directions=directions, sparsity=4).fit(images, texts)
    torch.testing.assert_close(dictionary.atoms_, directions.directions)
    assert dictionary.atom_names_ == directions.names


def test_bad_input_raises_lace_input_error():
    directions = toy_directions()
    images = toy_embeddings(directions, 50, 2.0, seed=1)
    texts = toy_embeddings(directions, 50, -2.0, seed=2)
    with pytest.raises(LaceInputError, match="same dimension"):
        ConceptDictionary(n_atoms=8, sparsity=2).fit(images, texts[:, :16])
    broken = images.clone()
    broken[7, 3] = float("nan")
    with pytest.raises(LaceInputError, match="row 7"):
        ConceptDictionary(n_atoms=8, sparsity=2).fit(broken, texts)
    dictionary = ConceptDictionary(n_atoms=8, sparsity=2).fit(images, texts)
    with pytest.raises(LaceInputError, match=r"\(N, 32\)"):
        dictionary.transform(images[:, :10], "image")
    with pytest.raises(LaceInputError, match="modality"):
        dictionary.transform(images, "audio")
    with pytest.raises(LaceInputError, match="not found"):
        ConceptDictionary(n_atoms=8, sparsity=2).fit("/nonexistent/images.npy", texts)
