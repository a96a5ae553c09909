"""A dictionary fit repeats bit for bit at a given number of intra-op threads (the demo fits at two)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from lace.dictionary import ConceptDictionary, learning
from lace.dictionary.sparse_coding import SparseCodes
from tests.toy_concepts import toy_directions, toy_embeddings

REPEATS = 20


@contextmanager
def _threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _statistics_after_one_batch(codes: SparseCodes, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B (`learning._accumulate`) from zero, then from their own values with forgetting, as a second batch."""
    generator = torch.Generator().manual_seed(1)
    state = learning.init_state(torch.randn(codes.n_atoms, batch.shape[1], generator=generator))
    learning._accumulate(state, codes, batch, beta=0.0)
    learning._accumulate(state, codes, batch, beta=0.9)
    return state.code_gram, state.code_data


def test_running_statistics_are_the_same_sums_at_one_and_two_threads():
    # 4096 rows x 6 x 6 products into 32 x 32 cells: enough for torch to split the sums across threads, and few
    # enough cells that two threads add into the same one
    generator = torch.Generator().manual_seed(0)
    n, sparsity, n_atoms, dim = 4096, 6, 32, 16
    indices = torch.rand(n, n_atoms, generator=generator).argsort(1)[:, :sparsity]
    codes = SparseCodes(indices, torch.rand(n, sparsity, generator=generator), n_atoms)
    batch = torch.randn(n, dim, generator=generator)
    with _threads(1):
        gram, data = _statistics_after_one_batch(codes, batch)
    with _threads(2):
        for _ in range(REPEATS):
            gram_again, data_again = _statistics_after_one_batch(codes, batch)
            assert torch.equal(gram_again, gram)
            assert torch.equal(data_again, data)


def test_two_fits_at_two_threads_give_the_same_dictionary():
    directions = toy_directions()
    images = toy_embeddings(directions, 3000, 2.0, seed=1)
    texts = toy_embeddings(directions, 3000, -2.0, seed=2)
    params = {"n_atoms": 16, "sparsity": 6, "batch_size": 2048, "n_epochs": 3, "random_state": 0}
    with _threads(2):
        fits = [ConceptDictionary(**params).fit(images, texts) for _ in range(3)]
        qualities = [fit.quality(images, texts) for fit in fits]
    for fit, quality in zip(fits[1:], qualities[1:]):
        assert torch.equal(fit.atoms_, fits[0].atoms_)
        assert quality == qualities[0]
