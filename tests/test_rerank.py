"""Hubness fixes at inference (CSLS, QB-Norm, DN) against direct computations on small matrices."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lace.eval.diagnostics import GeometryOptions, geometry_diagnostics, reranked_geometry
from lace.eval.metrics import recall_at_k
from lace.eval.rerank import QueryBank, RerankOptions, querybank_neighbours, reranked_neighbours


def _space(n_images=24, n_texts=40, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    images = F.normalize(torch.randn(n_images, dim, generator=generator), dim=1)
    owner = torch.arange(n_texts) % n_images
    texts = F.normalize(images[owner] + 0.8 * torch.randn(n_texts, dim, generator=generator), dim=1)
    return images, texts, owner.numpy()


def _authors_qb_norm(train_test: np.ndarray, test_test: np.ndarray, k: int = 1, beta: float = 20.0) -> np.ndarray:
    """QB-Norm as the authors' `dynamic_inverted_softmax.qb_norm` computes it (float64, exp domain):
    bank x gallery and query x gallery similarities in, re-scored query x gallery out."""
    retrieved = np.unique(np.argsort(-train_test, axis=1)[:, :k].reshape(-1))
    normalised = test_test.copy()
    rows = np.nonzero(np.isin(np.argsort(-test_test, axis=1)[:, 0], retrieved))[0]
    normalised[rows, :] = np.exp(beta * test_test[rows, :]) / np.exp(beta * train_test).sum(axis=0)
    return normalised


def _rows_ranked(scores: torch.Tensor | np.ndarray, k: int) -> torch.Tensor:
    return torch.as_tensor(np.asarray(scores)).topk(k, dim=1).indices


def test_csls_ranks_as_the_direct_formula_both_ways_with_and_without_a_bank():
    images, texts, _ = _space()
    bank = QueryBank(*_space(30, 50, seed=1)[:2])
    scores = images @ texts.T
    for bank_used, image_others, text_others in ((None, texts, images), (bank, bank.texts, bank.images)):
        image_penalty = (images @ image_others.T).topk(5, dim=1).values.mean(dim=1)
        text_penalty = (texts @ text_others.T).topk(5, dim=1).values.mean(dim=1)
        csls = 2 * scores - image_penalty[:, None] - text_penalty[None, :]
        forward, backward = reranked_neighbours("csls", images, texts, 6, bank=bank_used,
                                                options=RerankOptions(csls_k=5), chunk=7)
        torch.testing.assert_close(forward.indices, _rows_ranked(csls, 6), rtol=0, atol=0)
        torch.testing.assert_close(backward.indices, _rows_ranked(csls.T, 6), rtol=0, atol=0)
        torch.testing.assert_close(forward.scores, csls.topk(6, dim=1).values)


def test_distribution_normalisation_subtracts_a_share_of_the_sample_means():
    images, texts, _ = _space()
    bank_images, bank_texts = _space(30, 50, seed=2)[:2]
    weight = 0.25
    expected = (images - weight * bank_images.mean(0)) @ (texts - weight * bank_texts.mean(0)).T
    forward, backward = reranked_neighbours("dn", images, texts, 5, bank=QueryBank(bank_images, bank_texts),
                                            options=RerankOptions(dn_weight=weight), chunk=5)
    torch.testing.assert_close(forward.indices, _rows_ranked(expected, 5), rtol=0, atol=0)
    torch.testing.assert_close(backward.indices, _rows_ranked(expected.T, 5), rtol=0, atol=0)
    transductive, _ = reranked_neighbours("dn", images, texts, 5)
    own = (images - 0.5 * images.mean(0)) @ (texts - 0.5 * texts.mean(0)).T
    torch.testing.assert_close(transductive.indices, _rows_ranked(own, 5), rtol=0, atol=0)


@pytest.mark.parametrize("bank_k", [1, 3])
def test_querybank_normalisation_ranks_every_row_as_the_authors_code(bank_k):
    images, texts, _ = _space(n_images=30, n_texts=60, dim=6, seed=4)
    bank_texts = _space(30, 12, dim=6, seed=5)[1]  # a small bank: its activation set misses some images
    reference = _authors_qb_norm((bank_texts @ images.T).double().numpy(), (texts @ images.T).double().numpy(),
                                 k=bank_k, beta=20.0)
    ours = querybank_neighbours(texts, images, bank_texts, k=8, beta=20.0, bank_k=bank_k, chunk=9)
    torch.testing.assert_close(ours.indices, _rows_ranked(reference, 8), rtol=0, atol=0)
    # the dynamic switch matters here: some rows are re-scored (order changed), others kept as they were
    plain = (texts @ images.T).topk(8, dim=1).indices
    changed = (ours.indices != plain).any(dim=1)
    active = np.unique((bank_texts @ images.T).topk(bank_k, dim=1).indices.numpy())
    kept = ~torch.from_numpy(np.isin(plain[:, 0].numpy(), active))
    assert kept.any() and changed.any() and not changed[kept].any()


def test_querybank_without_a_bank_is_the_inverted_softmax_over_the_queries():
    images, texts, _ = _space(seed=6)
    forward, backward = reranked_neighbours("qbnorm", images, texts, 4, options=RerankOptions(qbnorm_beta=10.0))
    scores = images @ texts.T
    # every query's top-1 is in the activation set of the queries themselves: all rows normalised
    inverted_i2t = (10 * scores).exp() / (10 * scores).exp().sum(dim=0, keepdim=True)
    inverted_t2i = (10 * scores.T).exp() / (10 * scores.T).exp().sum(dim=0, keepdim=True)
    torch.testing.assert_close(forward.indices, _rows_ranked(inverted_i2t, 4), rtol=0, atol=0)
    torch.testing.assert_close(backward.indices, _rows_ranked(inverted_t2i, 4), rtol=0, atol=0)


def test_reranked_geometry_matches_recall_of_the_direct_scores_and_reduces_a_planted_hub():
    generator = torch.Generator().manual_seed(7)
    common = F.normalize(torch.randn(1, 16, generator=generator), dim=1)
    images = F.normalize(torch.randn(60, 16, generator=generator) + 2 * common, dim=1)  # all lean one way
    owner = np.arange(60)
    texts = F.normalize(images + 0.2 * torch.randn(60, 16, generator=generator), dim=1)
    texts[0] = common[0]  # a caption on the common direction: near every image, a hub
    options = GeometryOptions(k=5, baseline=False, chunk=16)
    plain = geometry_diagnostics(images, texts, owner, options)
    fixed = reranked_geometry(images, texts, owner, ["csls", "qbnorm", "dn"], options=options,
                              rerank_options=RerankOptions(csls_k=5))
    assert set(fixed) == {f"rerank/{m}/{key}" for m in ("csls", "qbnorm", "dn") for key in plain}
    scores = images @ texts.T
    image_penalty = scores.topk(5, dim=1).values.mean(1)
    text_penalty = scores.T.topk(5, dim=1).values.mean(1)
    direct = recall_at_k(2 * scores - image_penalty[:, None] - text_penalty[None, :], owner)
    for key, value in direct.items():
        assert fixed[f"rerank/csls/{key}"] == pytest.approx(value)
    for method in ("csls", "qbnorm", "dn"):
        assert fixed[f"rerank/{method}/hubness/i2t/skewness"] < plain["hubness/i2t/skewness"]
        assert fixed[f"rerank/{method}/hubness/i2t/largest_hub_share"] < plain["hubness/i2t/largest_hub_share"]


def test_rerank_results_do_not_depend_on_the_chunk_size():
    images, texts, owner = _space(n_images=50, n_texts=100, seed=8)
    bank = QueryBank(*_space(40, 70, seed=9)[:2])
    small = reranked_geometry(images, texts, owner, ["csls", "qbnorm", "dn"], bank,
                              GeometryOptions(k=5, baseline=False, chunk=3))
    large = reranked_geometry(images, texts, owner, ["csls", "qbnorm", "dn"], bank,
                              GeometryOptions(k=5, baseline=False, chunk=1024))
    assert small == pytest.approx(large)


def test_unknown_rerank_and_bad_knobs_are_refused():
    images, texts, _ = _space()
    with pytest.raises(ValueError, match="unknown rerank"):
        reranked_neighbours("mutual", images, texts, 3)
    with pytest.raises(ValueError, match="qbnorm_beta"):
        RerankOptions(qbnorm_beta=0.0)
