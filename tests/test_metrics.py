"""Retrieval and benchmark scoring rules on hand-built score matrices."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lace.eval.metrics import (
    group_accuracy,
    macro_accuracy,
    pairwise_accuracy,
    recall_at_k,
    recall_from_neighbours,
    retrieval_recall,
    winoground_scores,
)
from lace.eval.neighbours import cross_neighbours, topk_neighbours
from lace.eval.reciprocity import mutual_knn_overlap, one_way_rates


def test_recall_counts_every_caption_of_an_image_as_a_positive():
    # 3 images; captions 0,1 -> image 0; 2,3 -> image 1; 4 -> image 2
    owner = [0, 0, 1, 1, 2]
    scores = torch.tensor([
        [0.1, 0.9, 0.8, 0.0, 0.0],  # image 0: top-1 is caption 1 (its own) -> hit@1
        [0.9, 0.0, 0.1, 0.8, 0.0],  # image 1: top-1 caption 0 (image 0), top-2 caption 3 (own) -> miss@1, hit@2
        [0.5, 0.4, 0.3, 0.2, 0.1],  # image 2: its caption 4 ranks last -> miss@1, miss@2, hit@5
    ])
    figures = recall_at_k(scores, owner, ks=(1, 2, 5))
    assert figures["i2t/R@1"] == pytest.approx(1 / 3)
    assert figures["i2t/R@2"] == pytest.approx(2 / 3)
    assert figures["i2t/R@5"] == pytest.approx(1.0)
    # t2i: column-wise. caption0 -> best image 1 (wrong, own is 0) then 2 then 0
    # caption1 -> image 0 (right); caption2 -> image 0 (wrong), image 2, image 1 (rank 3)
    # caption3 -> image 1 (right); caption4 -> image 2 (right)
    assert figures["t2i/R@1"] == pytest.approx(3 / 5)
    assert figures["t2i/R@2"] == pytest.approx(3 / 5)  # caption0's own image 0 ranks 3rd (0.1 < 0.5, 0.9)
    assert figures["t2i/R@5"] == pytest.approx(1.0)


def test_recall_from_embeddings_matches_the_score_matrix_version():
    torch.manual_seed(0)
    images = F.normalize(torch.randn(40, 16), dim=1)
    owner = np.repeat(np.arange(40), 3)
    texts = F.normalize(images[owner] + 0.8 * torch.randn(120, 16), dim=1)
    expected = recall_at_k(images @ texts.T, owner, (1, 5, 10))
    assert retrieval_recall(images, texts, owner, (1, 5, 10), chunk=7) == expected
    assert 0 < expected["i2t/R@1"] < 1


def test_chunked_topk_matches_a_full_sort_in_both_directions():
    torch.manual_seed(1)
    queries, gallery = F.normalize(torch.randn(53, 8), dim=1), F.normalize(torch.randn(37, 8), dim=1)
    scores = queries @ gallery.T
    forward, backward = cross_neighbours(queries, gallery, k=5, reverse_k=4, chunk=6)
    grouped, _ = cross_neighbours(queries, gallery, k=5, chunk=16)  # blocks screened by row-group maxima
    torch.testing.assert_close(grouped.indices, scores.topk(5, dim=1).indices, rtol=0, atol=0)
    torch.testing.assert_close(forward.indices, scores.topk(5, dim=1).indices, rtol=0, atol=0)
    torch.testing.assert_close(backward.indices, scores.T.topk(4, dim=1).indices, rtol=0, atol=0)
    torch.testing.assert_close(backward.scores, scores.T.topk(4, dim=1).values)
    single = topk_neighbours(queries, gallery, k=3, chunk=10)
    torch.testing.assert_close(single.indices, scores.topk(3, dim=1).indices, rtol=0, atol=0)


def test_recall_from_neighbours_refuses_too_short_lists():
    with pytest.raises(ValueError, match="recall@5"):
        # 8 images, 8 captions: top-3 lists cannot answer recall@5
        recall_from_neighbours(np.zeros((8, 3), int), np.zeros((8, 3), int), list(range(8)), ks=(1, 5))


def test_pairwise_accuracy_counts_ties_as_failures():
    assert pairwise_accuracy([0.9, 0.5, 0.3, 0.2], [0.1, 0.5, 0.4, 0.1]) == pytest.approx(0.5)


def test_winoground_scores_follow_the_paper():
    # s[i, c, m] = s(caption_c, image_m)
    scores = np.array([
        [[0.9, 0.1], [0.2, 0.8]],  # all right: text, image, group
        [[0.9, 0.8], [0.2, 0.7]],  # text: c0>c1 on i0 (0.9>0.2), c1>c0 on i1 (0.7<0.8) -> text fails;
                                   # image: c0 prefers i0 (0.9>0.8), c1 prefers i1 (0.7>0.2) -> image ok
        [[0.5, 0.6], [0.4, 0.3]],  # text: 0.5>0.4 and 0.3>0.6? no; image: 0.5>0.6? no
        [[0.6, 0.1], [0.7, 0.2]],  # text: 0.6>0.7? no; image: 0.6>0.1 and 0.2>0.7? no
    ])
    figures = winoground_scores(scores)
    assert figures == {"text": 0.25, "image": 0.5, "group": 0.25}


def test_order_and_macro_accuracy():
    correct = np.array([True, True, False])
    groups = ["on", "on", "under"]
    assert group_accuracy(correct, groups) == {"on": 1.0, "under": 0.0}
    assert macro_accuracy(correct, groups) == pytest.approx(0.5)
    assert macro_accuracy(correct, groups, min_count=2) == pytest.approx(1.0)  # "under" has 1 item


def test_one_way_rates_on_a_hand_built_graph():
    # 3 images, captions 0,1 -> image 0; 2 -> image 1; 3 -> image 2
    owner = [0, 0, 1, 2]
    image_to_text = np.array([[1], [0], [3]])  # image 0 -> caption 1, image 1 -> caption 0, image 2 -> caption 3
    text_to_image = np.array([[0], [0], [1], [1]])  # caption 0,1 -> image 0; caption 2,3 -> image 1
    rates = one_way_rates(image_to_text, text_to_image, owner)
    # image 0: caption 1 -> image 0 (reciprocal); image 1: caption 0 -> image 0 (one-way);
    # image 2: caption 3 -> image 1 (one-way)
    assert rates["image"] == pytest.approx(2 / 3)
    # caption 0: image 0 -> caption 1, same image -> reciprocal; caption 1: image 0 -> caption 1 -> reciprocal
    # caption 2: image 1 -> caption 0 (image 0) -> one-way; caption 3: image 1 -> caption 0 -> one-way
    assert rates["text"] == pytest.approx(2 / 4)


def test_mutual_knn_overlap_counts_pairs_listed_both_ways():
    image_to_text = np.array([[0, 1], [1, 2]])  # 2 images, k=2
    text_to_image = np.array([[0, 1], [0, 1], [0, 1]])  # 3 captions
    # pairs (0,0) yes, (0,1) yes, (1,1) yes, (1,2) yes (caption 2 lists image 1)
    overlap = mutual_knn_overlap(image_to_text, text_to_image, k=2)
    assert overlap["image"] == pytest.approx(4 / 4)
    assert overlap["text"] == pytest.approx(4 / 6)
    overlap = mutual_knn_overlap(image_to_text, np.array([[1, 1], [1, 1], [0, 0]]), k=2)
    # (0,0): caption 0 lists only image 1 -> no; (0,1) no; (1,1) yes; (1,2): caption 2 lists image 0 -> no
    assert overlap["image"] == pytest.approx(1 / 4)


def test_grouped_screening_matches_a_full_sort_on_larger_blocks():
    torch.manual_seed(2)
    queries, gallery = F.normalize(torch.randn(300, 16), dim=1), F.normalize(torch.randn(90, 16), dim=1)
    scores = queries @ gallery.T
    _, backward = cross_neighbours(queries, gallery, k=3, reverse_k=10, chunk=64)  # 64-row blocks, groups of 16
    torch.testing.assert_close(backward.indices, scores.T.topk(10, dim=1).indices, rtol=0, atol=0)
    torch.testing.assert_close(backward.scores, scores.T.topk(10, dim=1).values)


def test_exact_search_over_gallery_blocks_equals_one_pass():
    generator = torch.Generator().manual_seed(8)
    queries = F.normalize(torch.randn(30, 12, generator=generator), dim=1)
    gallery = F.normalize(torch.randn(500, 12, generator=generator), dim=1)
    whole = topk_neighbours(queries, gallery, 10)
    for block in (7, 64, 499):
        blocked = topk_neighbours(queries, gallery, 10, chunk=8, gallery_block=block)
        assert torch.equal(blocked.indices, whole.indices), block
        torch.testing.assert_close(blocked.scores, whole.scores)
