"""LACE-local's one upper pass over positives and edited maps: BatchNorm statistics from the positives only."""

import copy

import pytest
import torch

from lace.encoders.open_clip_encoder import load_open_clip
from lace.local.towers import ImageTowerSplit
from tests.conftest import randomise_batch_norms

BATCH = 6


@pytest.fixture()
def resnet():
    """A random tiny ResNet CLIP in training mode, with BatchNorms that are not the identity, in float64 (BatchNorm
    over a few rows is ill-conditioned: float32 rounding alone would move gradients by 1e-3 relative)."""
    torch.manual_seed(0)
    encoder = load_open_clip("lace-micro-rn-32")
    randomise_batch_norms(encoder.model)
    with torch.no_grad():
        for module in encoder.model.visual.modules():
            if isinstance(module, torch.nn.BatchNorm2d):  # open_clip starts some at zero weight
                module.weight.normal_(1.0, 0.2)
    return encoder.double().train()


def _features(resnet, layer="layer1"):
    split = ImageTowerSplit(resnet.model, layer)
    pixels = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        features = split.lower(pixels)
    generator = torch.Generator().manual_seed(2)
    edited = [features + torch.randn(features.shape, generator=generator, dtype=torch.float64) for _ in range(2)]  # (B, P, C) each
    return split, features, edited


def _norm_buffers(model):
    return {name: value.clone() for name, value in model.named_buffers() if "running" in name or "num_batches" in name}


def test_positives_come_out_as_a_training_pass_over_them_alone(resnet):
    split, features, edited = _features(resnet)
    alone = copy.deepcopy(resnet)
    split_alone = ImageTowerSplit(alone.model, "layer1")
    split_alone.grid = split.grid
    features_alone = features.clone().requires_grad_()
    features_batched = features.clone().requires_grad_()
    expected = split_alone.upper(features_alone)
    together = split.upper(torch.cat([features_batched, *edited]), reference_rows=BATCH)
    torch.testing.assert_close(together[:BATCH], expected)
    # the running statistics move once, by the positives alone
    buffers, buffers_alone = _norm_buffers(resnet.model.visual), _norm_buffers(alone.model.visual)
    assert buffers.keys() == buffers_alone.keys() and buffers
    for name, value in buffers.items():
        torch.testing.assert_close(value, buffers_alone[name], msg=name)
    # and the positives' gradient (through their batch statistics too) is the plain one
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (together[:BATCH] * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(features_batched.grad, features_alone.grad)
    for (name, parameter), (_, parameter_alone) in zip(resnet.model.visual.named_parameters(),
                                                       alone.model.visual.named_parameters()):
        if parameter_alone.grad is not None:
            torch.testing.assert_close(parameter.grad, parameter_alone.grad, msg=lambda m, name=name: f"{name}: {m}")


def test_edited_maps_are_normalised_as_their_positives(resnet):
    split, features, edited = _features(resnet)
    unedited = split.upper(torch.cat([features, features]), reference_rows=BATCH)
    torch.testing.assert_close(unedited[BATCH:], unedited[:BATCH])  # a zero edit gives back the positive
    first = split.upper(torch.cat([features, edited[0]]), reference_rows=BATCH)
    second = split.upper(torch.cat([features, edited[1], edited[0]]), reference_rows=BATCH)
    torch.testing.assert_close(first[:BATCH], second[:BATCH])  # the edits do not set the positives' statistics
    torch.testing.assert_close(first[BATCH:], second[2 * BATCH :])  # nor each other's
    mixed = split.upper(torch.cat([features, edited[0]]))  # batch statistics over both, as before
    assert not torch.allclose(mixed[:BATCH], first[:BATCH], atol=1e-4)


def test_eval_mode_is_left_as_it_is(resnet):
    resnet.eval()
    split, features, edited = _features(resnet)
    before = _norm_buffers(resnet.model.visual)
    with torch.no_grad():
        together = split.upper(torch.cat([features, edited[0]]), reference_rows=BATCH)
        torch.testing.assert_close(together, split.upper(torch.cat([features, edited[0]])))
    after = _norm_buffers(resnet.model.visual)
    assert all(torch.equal(before[name], after[name]) for name in before)
