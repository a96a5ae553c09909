import pytest
import torch

from lace.encoders.open_clip_encoder import load_open_clip
from lace.errors import LaceInputError
from lace.local.towers import RESNET_STAGES, ImageTowerSplit, TextTowerSplit


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return load_open_clip("lace-micro-rn-32").eval()


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return load_open_clip("lace-micro-32").eval()


def _pixels(n=3):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("layer", RESNET_STAGES)
def test_resnet_split_rejoins_to_the_encoder(resnet, layer):
    split = ImageTowerSplit(resnet.model, layer)
    with torch.no_grad():
        features = split.lower(_pixels())
        torch.testing.assert_close(split.upper(features), resnet.encode_images(_pixels()))


def test_resnet_grid_sizes_at_32_px(resnet):
    grids = {}
    for layer in RESNET_STAGES:
        split = ImageTowerSplit(resnet.model, layer)
        with torch.no_grad():
            features = split.lower(_pixels(1))
        grids[layer] = (split.grid, features.shape[-1])
    assert grids == {
        "stem": ((8, 8), 16), "layer1": ((8, 8), 64), "layer2": ((4, 4), 128),
        "layer3": ((2, 2), 256), "layer4": ((1, 1), 512),
    }


@pytest.mark.parametrize("layer", ["block0", "block1", "block2"])
def test_vit_split_rejoins_to_the_encoder(vit, layer):
    split = ImageTowerSplit(vit.model, layer)
    with torch.no_grad():
        features = split.lower(_pixels())
        assert split.regions(features).shape[1] == 64 and split.grid == (8, 8)
        torch.testing.assert_close(split.upper(features), vit.encode_images(_pixels()))


@pytest.mark.parametrize("layer", ["block0", "block1", "block2"])
def test_text_split_rejoins_to_the_encoder(resnet, layer):
    tokens = resnet.tokenize(["a red square left of a blue circle", "a green star"])
    split = TextTowerSplit(resnet.model, layer)
    with torch.no_grad():
        torch.testing.assert_close(split.upper(split.lower(tokens), tokens), resnet.encode_tokens(tokens))


def test_unknown_layer_names_the_field(resnet, vit):
    with pytest.raises(LaceInputError, match="layer"):
        ImageTowerSplit(resnet.model, "block1")
    with pytest.raises(LaceInputError, match="block0 .. block2"):
        ImageTowerSplit(vit.model, "block3")
