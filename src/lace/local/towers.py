"""Split an open_clip tower at a layer L: `features = lower(x)`, `embedding = upper(features)`.

Features are always per position, (B, P, C): the spatial cells of a ResNet map (row-major over
its (H, W) grid), the token sequence of a ViT (class token first, then the patches), or the
token states of the text transformer. `upper(lower(x))` is the encoder's own unit embedding,
and `upper` keeps the autograd graph, so an edit made on the features reaches the weights
above L (and, through the features, those below it).

Layer names:
- ResNet image tower (`open_clip.ModifiedResNet`): "stem", "layer1" .. "layer4" = the map that
  block puts out; the attention pool always stays in `upper`.
- ViT image tower and text tower: "block<k>" = the tokens entering transformer block k
  (k = 0 is right after the embeddings, k = n_blocks is after the last block).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lace.errors import input_error
from lace.local.batch_norm import reference_batch_norm

RESNET_STAGES = ("stem", "layer1", "layer2", "layer3", "layer4")


def _block_index(layer: str, n_blocks: int, where: str) -> int:
    if layer.startswith("block") and layer[5:].isdigit() and int(layer[5:]) <= n_blocks:
        return int(layer[5:])
    raise input_error(where, "layer", f"block0 .. block{n_blocks}", layer)


def _projected(pooled: Tensor, projection) -> Tensor:
    if projection is None:
        return pooled
    if isinstance(projection, torch.nn.Linear):
        return projection(pooled)
    return pooled @ projection


class ImageTowerSplit:
    """The image tower of an open_clip model cut at `layer`.

    grid: (H, W) of the region positions at L; n_prefix: positions before the regions
    (1 for a ViT's class token, 0 for a ResNet); width: C.
    """

    def __init__(self, clip: torch.nn.Module, layer: str):
        self.visual = clip.visual
        self.layer = layer
        self.is_resnet = hasattr(self.visual, "attnpool")
        if self.is_resnet:
            if layer not in RESNET_STAGES:
                raise input_error("ResNet image tower", "layer", f"one of {list(RESNET_STAGES)}", layer)
            self.n_prefix = 0
            self._cut = RESNET_STAGES.index(layer) + 1
        elif hasattr(self.visual, "transformer") and hasattr(self.visual, "_embeds"):
            self.n_prefix = 1 if getattr(self.visual, "pool_type", "tok") == "tok" else 0
            self._cut = _block_index(layer, len(self.visual.transformer.resblocks), "ViT image tower")
        else:
            raise input_error("image tower", "architecture", "an open_clip ModifiedResNet or VisionTransformer",
                              type(self.visual).__name__)
        self.grid: tuple[int, int] | None = None

    def _resnet_stages(self) -> list:
        v = self.visual
        return [v.stem, v.layer1, v.layer2, v.layer3, v.layer4]

    def lower(self, pixels: Tensor) -> Tensor:
        """(B, 3, H_in, W_in) preprocessed pixels -> (B, P, C) features at L; sets `grid`."""
        if self.is_resnet:
            x = pixels.to(self.visual.conv1.weight.dtype)
            for stage in self._resnet_stages()[: self._cut]:
                x = stage(x)
            batch, channels, height, width = x.shape
            self.grid = (height, width)
            return x.reshape(batch, channels, height * width).transpose(1, 2)  # (B, HW, C)
        x = self.visual._embeds(pixels)
        side = round((x.shape[1] - self.n_prefix) ** 0.5)
        self.grid = (side, side)
        for block in self.visual.transformer.resblocks[: self._cut]:
            x = block(x)
        return x  # (B, n_prefix + P, C)

    def upper(self, features: Tensor, reference_rows: int | None = None) -> Tensor:
        """(B, P, C) features at L -> (B, d) unit embeddings, with gradient.

        reference_rows: training-mode BatchNorm layers above L take their batch statistics from the first
        `reference_rows` maps only and normalise every map with them (`lace.local.batch_norm`); None: from
        all B.
        """
        if reference_rows is not None:
            with reference_batch_norm(self.visual, reference_rows):
                return self.upper(features)
        if self.is_resnet:
            if self.grid is None:
                raise ValueError("call lower() first: upper() needs the grid of the map")
            batch, _, channels = features.shape
            x = features.transpose(1, 2).reshape(batch, channels, *self.grid)
            for stage in self._resnet_stages()[self._cut :]:
                x = stage(x)
            pooled = self.visual.attnpool(x)
        else:
            x = features
            for block in self.visual.transformer.resblocks[self._cut :]:
                x = block(x)
            pooled, _ = self.visual._pool(x)
            pooled = _projected(pooled, self.visual.proj)
        return F.normalize(pooled, dim=-1)

    def regions(self, features: Tensor) -> Tensor:
        """(B, P, C) features -> (B, H*W, C) the region positions only (no class token)."""
        return features[:, self.n_prefix :]


class TextTowerSplit:
    """The text tower of an open_clip `CLIP` cut at `layer` ("block<k>")."""

    def __init__(self, clip: torch.nn.Module, layer: str):
        if not hasattr(clip, "token_embedding"):
            raise input_error("text tower", "architecture", "an open_clip CLIP text transformer",
                              type(clip).__name__)
        self.clip = clip
        self.layer = layer
        self._cut = _block_index(layer, len(clip.transformer.resblocks), "text tower")

    def lower(self, tokens: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, C) token states entering block k."""
        clip = self.clip
        cast_dtype = clip.transformer.get_cast_dtype()
        x = clip.token_embedding(tokens).to(cast_dtype) + clip.positional_embedding.to(cast_dtype)
        for block in clip.transformer.resblocks[: self._cut]:
            x = block(x, attn_mask=clip.attn_mask)
        return x

    def upper(self, states: Tensor, tokens: Tensor) -> Tensor:
        """(B, T, C) states at L and the (B, T) token ids they came from -> (B, d) unit embeddings."""
        clip = self.clip
        x = states
        for block in clip.transformer.resblocks[self._cut :]:
            x = block(x, attn_mask=clip.attn_mask)
        x = clip.ln_final(x)
        pooled = x[torch.arange(x.shape[0], device=x.device), pooled_text_position(clip, tokens)]
        return F.normalize(_projected(pooled, clip.text_projection), dim=-1)


def pooled_text_position(clip: torch.nn.Module, tokens: Tensor) -> Tensor:
    """(B,) the position whose state becomes the caption's embedding (CLIP: end of text)."""
    pool_type = getattr(clip, "text_pool_type", "argmax")
    if pool_type == "argmax":
        return tokens.argmax(dim=-1)
    if pool_type == "eos":
        return (tokens == clip.text_eos_id).int().argmax(dim=-1)
    if pool_type == "last":
        return torch.full_like(tokens[:, 0], tokens.shape[1] - 1)
    if pool_type == "first":
        return torch.zeros_like(tokens[:, 0])
    raise input_error("text tower", "text_pool_type", "argmax, eos, first or last", pool_type)


def region_features(clip: torch.nn.Module, pixels: Tensor, layer: str, batch_size: int = 500) -> tuple[Tensor, tuple[int, int]]:
    """Region features (N, P, C) of images at `layer`, without gradient, and the (H, W) grid."""
    split = ImageTowerSplit(clip, layer)
    with torch.no_grad():
        parts = [split.regions(split.lower(pixels[start : start + batch_size]))
                 for start in range(0, len(pixels), batch_size)]
    return torch.cat(parts), split.grid
