"""The plain loss equals open_clip's ClipLoss; the LACE loss adds exactly the negatives it says."""

import pytest
import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss

from lace.encoders import load_encoder
from lace.losses import clip_loss, lace_loss


def unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_clip_loss_matches_open_clip():
    U, V = unit(16, 32, seed=1), unit(16, 32, seed=2)
    scale = torch.tensor(14.3)
    torch.testing.assert_close(clip_loss(U, V, scale), ClipLoss()(U, V, scale))


def test_sharded_rows_average_to_the_global_loss():
    # What each of 4 processes computes (its rows against everyone's columns) averages to the loss of the whole batch.
    U, V = unit(16, 32, seed=3), unit(16, 32, seed=4)
    negatives, valid = unit(16, 3, 32, seed=5), torch.rand(16, 3, generator=torch.Generator().manual_seed(6)) > 0.4
    scale = torch.tensor(10.0)
    whole = lace_loss(U, V, scale, negatives, valid, negatives.flip(0), valid.flip(0))
    shards = [
        lace_loss(U[r * 4:(r + 1) * 4], V[r * 4:(r + 1) * 4], scale, negatives[r * 4:(r + 1) * 4], valid[r * 4:(r + 1) * 4],
                  negatives.flip(0)[r * 4:(r + 1) * 4], valid.flip(0)[r * 4:(r + 1) * 4],
                  gallery_images=U, gallery_texts=V, row_offset=4 * r)
        for r in range(4)
    ]
    torch.testing.assert_close(torch.stack(shards).mean(), whole)


def test_lace_loss_is_an_explicit_extended_softmax():
    U, V = unit(6, 8, seed=7), unit(6, 8, seed=8)
    caption_negatives, image_negatives = unit(6, 2, 8, seed=9), unit(6, 2, 8, seed=10)
    caption_valid = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 1], [0, 1], [1, 0]], dtype=torch.bool)
    scale = torch.tensor(5.0)
    expected = 0.0
    for i in range(6):
        i2t = [scale * U[i] @ V[j] for j in range(6)] + [scale * U[i] @ caption_negatives[i, m] for m in range(2) if caption_valid[i, m]]
        t2i = [scale * V[i] @ U[j] for j in range(6)] + [scale * V[i] @ image_negatives[i, m] for m in range(2)]
        expected += -torch.log_softmax(torch.stack(i2t), 0)[i] - torch.log_softmax(torch.stack(t2i), 0)[i]
    expected = expected / 12
    got = lace_loss(U, V, scale, caption_negatives, caption_valid, image_negatives, None)
    torch.testing.assert_close(got, expected)


def test_rows_without_valid_edits_and_weight_zero_give_the_plain_loss():
    U, V = unit(8, 16, seed=11), unit(8, 16, seed=12)
    negatives = torch.full((8, 3, 16), float("nan"))  # whatever invalid slots hold must not matter
    none_valid = torch.zeros(8, 3, dtype=torch.bool)
    scale = torch.tensor(7.0, requires_grad=True)
    U.requires_grad_(True)
    loss = lace_loss(U, V, scale, negatives, none_valid, negatives, none_valid)
    torch.testing.assert_close(loss, clip_loss(U, V, scale))
    loss.backward()
    assert torch.isfinite(U.grad).all()
    close = F.normalize(V.detach().unsqueeze(1) + 0.05 * unit(8, 2, 16, seed=13), dim=-1)
    torch.testing.assert_close(lace_loss(U, V, scale, close, None, weight=0.0), clip_loss(U, V, scale))
    half = lace_loss(U, V, scale, close, None, weight=0.5)
    full = lace_loss(U, V, scale, close, None)
    torch.testing.assert_close(half, 0.5 * (clip_loss(U, V, scale) + full))


def test_close_counterfactuals_raise_the_loss_and_train_both_towers():
    torch.manual_seed(0)
    encoder = load_encoder("lace-micro-32", None)
    pixels = torch.randn(8, 3, 32, 32)
    tokens = encoder.tokenize([f"a {c} thing number {i}" for i, c in enumerate("abcdefgh")])
    U, V, scale = encoder(pixels, tokens)
    # Negatives a small step away from each positive, made from the embeddings themselves (keeping the graph).
    caption_negatives = F.normalize(V.unsqueeze(1) + 0.1 * unit(8, 4, V.shape[1], seed=14), dim=-1)
    image_negatives = F.normalize(U.unsqueeze(1) + 0.1 * unit(8, 4, U.shape[1], seed=15), dim=-1)
    plain = clip_loss(U, V, scale)
    loss = lace_loss(U, V, scale, caption_negatives, None, image_negatives, None)
    # Near-duplicates of the positives each add about one more exp(positive) to the denominators.
    assert loss.item() > plain.item() + 0.2
    encoder.zero_grad()
    loss.backward()
    visual = [p.grad for n, p in encoder.named_parameters() if n.startswith("model.visual.")]
    text = [p.grad for n, p in encoder.named_parameters() if n.startswith("model.transformer.")]
    assert visual and text
    assert all(g is not None for g in visual + text)
    assert sum(g.abs().sum() for g in visual) > 0 and sum(g.abs().sum() for g in text) > 0


def test_bad_negative_shapes_are_refused():
    U, V = unit(4, 8), unit(4, 8, seed=1)
    with pytest.raises(ValueError, match="shape"):
        lace_loss(U, V, torch.tensor(1.0), unit(4, 2, 7))
