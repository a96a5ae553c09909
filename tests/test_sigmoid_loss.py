"""The sigmoid loss equals open_clip's SigLipLoss; each counterfactual negative is one more z = -1 term."""

import math

import pytest
import torch
import torch.nn.functional as F
from open_clip.loss import SigLipLoss

from lace.errors import LaceInputError
from lace.losses import duplicate_pairs, sigmoid_loss


def unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def test_sigmoid_loss_matches_open_clip_with_gradients():
    U0, V0 = unit(16, 32, seed=1), unit(16, 32, seed=2)
    scale0, bias0 = torch.tensor(10.0), torch.tensor(-10.0)
    ours = leaves(U0, V0, scale0, bias0)
    theirs = leaves(U0, V0, scale0, bias0)
    loss = sigmoid_loss(*ours[:3], logit_bias=ours[3])
    expected = SigLipLoss()(*theirs)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    for name, a, b in zip(("U", "V", "logit_scale", "logit_bias"), ours, theirs):
        assert a.grad is not None and a.grad.abs().sum() > 0, name
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    # a learned pair of values away from SigLIP's initialisation, and HF's (1,)-shaped parameters
    s, b = torch.tensor([3.2]), torch.tensor([1.5])
    torch.testing.assert_close(sigmoid_loss(U0, V0, s, logit_bias=b), SigLipLoss()(U0, V0, s, b).reshape(()))


def test_each_extra_negative_is_exactly_one_term():
    U, V = unit(5, 8, seed=3), unit(5, 8, seed=4)
    caption_negatives, image_negatives = unit(5, 3, 8, seed=5), unit(5, 2, 8, seed=6)
    caption_valid = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 0]], dtype=torch.bool)
    scale, bias = torch.tensor(6.0), torch.tensor(-2.0)
    plain = sigmoid_loss(U, V, scale, logit_bias=bias)
    expected = plain.clone()
    for i in range(5):
        for m in range(3):
            if caption_valid[i, m]:
                expected = expected - F.logsigmoid(-(scale * U[i] @ caption_negatives[i, m] + bias)) / 5
        for m in range(2):
            expected = expected - F.logsigmoid(-(scale * V[i] @ image_negatives[i, m] + bias)) / 5
    got = sigmoid_loss(U, V, scale, caption_negatives, caption_valid, image_negatives, None, logit_bias=bias)
    torch.testing.assert_close(got, expected)
    # one negative at a time: the loss rises by that negative's own term and nothing else moves
    for i, m in ((0, 0), (2, 1), (4, 0)):
        one = torch.zeros(5, 3, dtype=torch.bool)
        one[i, m] = True
        alone = sigmoid_loss(U, V, scale, caption_negatives, one, logit_bias=bias)
        term = -F.logsigmoid(-(scale * U[i] @ caption_negatives[i, m] + bias)) / 5
        torch.testing.assert_close(alone - plain, term)
    # its gradient reaches only its own slot, and only its own image row
    negatives, queries = leaves(caption_negatives, U)
    sigmoid_loss(queries, V, scale, negatives, one, logit_bias=bias).backward()
    assert negatives.grad[~one].abs().max() == 0 and negatives.grad[one].abs().max() > 0
    plain_queries = leaves(U)[0]
    sigmoid_loss(plain_queries, V, scale, logit_bias=bias).backward()
    changed = (queries.grad - plain_queries.grad).abs().amax(dim=1) > 0
    assert changed.tolist() == [i == 4 for i in range(5)]


def test_invalid_negatives_are_masked_and_the_weight_scales_the_extra_terms():
    U, V = leaves(unit(8, 16, seed=7), unit(8, 16, seed=8))
    scale, bias = torch.tensor(10.0), torch.tensor(-5.0)
    poisoned = torch.full((8, 3, 16), float("nan"))  # whatever invalid slots hold must not matter
    none_valid = torch.zeros(8, 3, dtype=torch.bool)
    loss = sigmoid_loss(U, V, scale, poisoned, none_valid, poisoned, none_valid, logit_bias=bias)
    torch.testing.assert_close(loss, sigmoid_loss(U, V, scale, logit_bias=bias))
    loss.backward()
    assert torch.isfinite(U.grad).all() and torch.isfinite(V.grad).all()
    close = F.normalize(U.detach().unsqueeze(1) + 0.05 * unit(8, 2, 16, seed=9), dim=-1)  # near copies of the images
    plain = sigmoid_loss(U, V, scale, logit_bias=bias)
    full = sigmoid_loss(U, V, scale, close, None, logit_bias=bias)
    assert full.item() > plain.item() + 1.0  # each scores as a near-match, a large term
    torch.testing.assert_close(sigmoid_loss(U, V, scale, close, None, weight=0.0, logit_bias=bias), plain)
    torch.testing.assert_close(sigmoid_loss(U, V, scale, close, None, weight=0.25, logit_bias=bias),
                               plain + 0.25 * (full - plain))


def test_sharded_rows_average_to_the_global_loss_and_gradient():
    U0, V0 = unit(16, 32, seed=10), unit(16, 32, seed=11)
    negatives = unit(16, 3, 32, seed=12)
    valid = torch.rand(16, 3, generator=torch.Generator().manual_seed(13)) > 0.4
    scale, bias = torch.tensor(10.0), torch.tensor(-10.0)
    U, V = leaves(U0, V0)
    whole = sigmoid_loss(U, V, scale, negatives, valid, negatives.flip(0), valid.flip(0), weight=0.7, logit_bias=bias)
    whole.backward()
    Us, Vs = leaves(U0, V0)
    shards = [
        sigmoid_loss(Us[r * 4:(r + 1) * 4], Vs[r * 4:(r + 1) * 4], scale, negatives[r * 4:(r + 1) * 4],
                     valid[r * 4:(r + 1) * 4], negatives.flip(0)[r * 4:(r + 1) * 4], valid.flip(0)[r * 4:(r + 1) * 4],
                     weight=0.7, logit_bias=bias, gallery_images=Us, gallery_texts=Vs, row_offset=4 * r)
        for r in range(4)
    ]
    mean = torch.stack(shards).mean()
    torch.testing.assert_close(mean, whole)
    mean.backward()
    torch.testing.assert_close(Us.grad, U.grad)
    torch.testing.assert_close(Vs.grad, V.grad)


def test_false_negatives_leave_their_terms_out():
    U, V = unit(6, 8, seed=14), unit(6, 8, seed=15)
    scale, bias = torch.tensor(4.0), torch.tensor(-1.0)
    keys = torch.tensor([0, 1, 0, 2, 3, 4])  # pairs 0 and 2 share an image
    mask = duplicate_pairs(keys, torch.arange(6))
    logits = scale * U @ V.T + bias
    terms = -F.logsigmoid((2 * torch.eye(6) - 1) * logits)
    expected = (terms.sum() - terms[0, 2] - terms[2, 0]) / 6
    torch.testing.assert_close(sigmoid_loss(U, V, scale, logit_bias=bias, false_negatives=mask), expected)


def test_bad_shapes_are_refused():
    U, V = unit(4, 8), unit(4, 8, seed=1)
    with pytest.raises(ValueError, match="shape"):
        sigmoid_loss(U, V, torch.tensor(1.0), unit(4, 2, 7), logit_bias=torch.tensor(0.0))
    with pytest.raises(LaceInputError, match="logit_bias"):
        sigmoid_loss(U, V, torch.tensor(1.0), logit_bias=torch.zeros(2))
    # a single pair: its only term is its match, -log sigmoid(s + b)
    single = sigmoid_loss(U[:1], U[:1], torch.tensor(2.0), logit_bias=torch.tensor(-1.0))
    torch.testing.assert_close(single, torch.tensor(math.log1p(math.exp(-1.0))))
