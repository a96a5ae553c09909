"""The ONNX Runtime towers against the PyTorch towers, on tiny random towers of the same kinds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from timm.models.efficientnet import _gen_efficientnet_lite
from transformers import BertConfig, BertModel

from lace.encoders.towers import image_tower, onnx_runtime, text_tower
from tests.conftest import randomise_batch_norms

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def tiny_image_tower() -> image_tower.ImageTower:
    """An `ImageTower` whose network is a random EfficientNet-Lite at a quarter of the width."""
    torch.manual_seed(0)
    tower = image_tower.ImageTower(pretrained=False)
    tower.model = _gen_efficientnet_lite("efficientnet_lite0", channel_multiplier=0.25, depth_multiplier=0.3,
                                         pretrained=False, **image_tower.ARCHITECTURE_OPTIONS)
    randomise_batch_norms(tower.model)
    return tower.eval()


@pytest.fixture(scope="module")
def tiny_text_tower() -> SimpleNamespace:
    """What `TextTower.forward` reads (`model`, `pad_token_id`) around a random two-layer BERT."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    return SimpleNamespace(model=BertModel(config, add_pooling_layer=False).eval(), pad_token_id=0)


def _torch_text_features(tower, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return text_tower.TextTower.forward(tower, tokens)


def test_image_session_equals_the_torch_tower_at_any_batch_size(tiny_image_tower):
    session = onnx_runtime.image_session(tiny_image_tower, threads=1)
    for n in (1, 5):
        pixels = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(n))
        with torch.inference_mode():
            expected = tiny_image_tower(pixels)
        got = torch.from_numpy(session(pixels.numpy()))
        assert got.shape == (n, image_tower.FEATURE_DIM)
        assert float(F.cosine_similarity(got, expected).min()) > 1 - 1e-4
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-3)


def test_text_session_equals_the_torch_tower_with_padding_at_any_length(tiny_text_tower):
    session = onnx_runtime.text_session(tiny_text_tower, threads=1)
    generator = torch.Generator().manual_seed(0)
    for n, length in ((1, 3), (4, 11), (7, 40)):
        tokens = torch.randint(1, 120, (n, length), generator=generator)
        for row in range(1, n):  # rows of different lengths, padded with the pad id; one column all padding
            tokens[row, length - 1 - row % max(length - 1, 1):] = 0
        tokens = torch.cat([tokens, torch.zeros(n, 1, dtype=torch.long)], dim=1)
        expected = _torch_text_features(tiny_text_tower, tokens)
        got = torch.from_numpy(session(*onnx_runtime.text_inputs(tokens, tiny_text_tower.pad_token_id)))
        assert got.shape == expected.shape == (n, 32)
        assert float(F.cosine_similarity(got, expected).min()) > 1 - 1e-4


def test_export_leaves_every_module_in_the_mode_it_was_in(tiny_text_tower, tiny_image_tower):
    """The exporter restores the wrapper's mode onto its children; a BERT left in training mode
    would silently compute with dropout afterwards."""
    tiny_text_tower.model.encoder.layer[0].train()
    try:
        modes = {name: module.training for name, module in tiny_text_tower.model.named_modules()}
        onnx_runtime.text_session(tiny_text_tower, threads=1)
        assert {name: module.training for name, module in tiny_text_tower.model.named_modules()} == modes
    finally:
        tiny_text_tower.model.eval()
    onnx_runtime.image_session(tiny_image_tower, threads=1)
    assert not any(module.training for module in tiny_image_tower.modules())


def test_a_session_keeps_the_weights_it_was_exported_with(tiny_image_tower):
    """Sessions are copies: `features._session` re-exports when the fingerprint changes."""
    pixels = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    session = onnx_runtime.image_session(tiny_image_tower, threads=1)
    before = session(pixels.numpy())
    with torch.no_grad():
        tiny_image_tower.model.conv_head.weight.mul_(2.0)
    try:
        assert (session(pixels.numpy()) == before).all()
        with torch.inference_mode():
            changed = tiny_image_tower(pixels)
        assert not torch.allclose(torch.from_numpy(before), changed, atol=1e-3)
    finally:
        with torch.no_grad():
            tiny_image_tower.model.conv_head.weight.div_(2.0)
