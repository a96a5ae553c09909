"""The tops of the towers: the layers above a cut, run on cached intermediate features.

The cut sits below the last stage of EfficientNet-Lite0 and below the last two layers
of MiniLM (`IMAGE_TOP_STAGES`, `TEXT_TOP_LAYERS`). Below it the towers stay locked and
their outputs are cached once (`lace.encoders.towers.top_features`); above it the
layers are trainable, and they pool over positions and tokens as the towers do:

- image: timm stage 6 (one MBConv block, (N, 192, 7, 7) -> (N, 320, 7, 7)), the 1x1
  head convolution with its BatchNorm and ReLU6 ((N, 1280, 7, 7)), global average pool;
- text: BERT layers 4 and 5 on (N, L, 384) token states with their (N, L) mask, then
  the mean over real tokens (sentence-transformers' pooling of all-MiniLM-L6-v2).

`ImageTop` and `TextTop` wrap the modules of any timm EfficientNet and any Hugging Face
BERT by reference (not copies), so training them trains the tower they belong to.
`TowersTop` puts them together with a `TowersDualEncoder`'s heads: a module mapping
cached image features and cached token states to unit embeddings. Because it holds the
encoder's own modules, `save_top_checkpoint` writes an ordinary heads checkpoint with
the top blocks unlocked, which `load_encoder("lace-towers", pretrained=file)` (and so
`lace eval`) reads.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from lace.encoders.towers.checkpoint import save_heads_checkpoint
from lace.encoders.towers.model import TowersDualEncoder
from lace.encoders.towers.text_tower import mean_pool

IMAGE_TOP_STAGES = 1
"""timm stages of EfficientNet-Lite0 above the cut: stage 6, its one block (16th of 16)."""
TEXT_TOP_LAYERS = 2
"""MiniLM layers above the cut: layers 4 and 5 of 0..5."""
IMAGE_CUT_SHAPE = (192, 7, 7)
"""Channels, height, width of the EfficientNet-Lite0 map entering stage 6 at 224 x 224."""


def attention_mask_for(config, states: torch.Tensor, mask: torch.Tensor):
    """The attention mask a BERT layer takes, built as `BertModel` builds it from a (N, L) 0/1 mask."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=config, inputs_embeds=states, attention_mask=mask)


def image_below_top(model: torch.nn.Module, pixels: torch.Tensor, top_stages: int = IMAGE_TOP_STAGES) -> torch.Tensor:
    """(N, 3, H, W) pixels -> the map entering the top `top_stages` stages of a timm EfficientNet."""
    x = model.bn1(model.conv_stem(pixels))
    for stage in model.blocks[:len(model.blocks) - top_stages]:
        x = stage(x)
    return x


def text_below_top(bert: torch.nn.Module, tokens: torch.Tensor, mask: torch.Tensor,
                   top_layers: int = TEXT_TOP_LAYERS) -> torch.Tensor:
    """(N, L) token ids and 0/1 mask -> (N, L, h) token states entering the top `top_layers` layers."""
    states = bert.embeddings(input_ids=tokens)
    attention = attention_mask_for(bert.config, states, mask)
    for layer in bert.encoder.layer[:len(bert.encoder.layer) - top_layers]:
        states = layer(states, attention)
    return states


class ImageTop(torch.nn.Module):
    """The top stages, head convolution and global average pool of a timm EfficientNet."""

    def __init__(self, model: torch.nn.Module, top_stages: int = IMAGE_TOP_STAGES):
        super().__init__()
        self.stages = torch.nn.Sequential(*model.blocks[len(model.blocks) - top_stages:])
        self.conv_head, self.bn2, self.global_pool = model.conv_head, model.bn2, model.global_pool

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(N, C, h, w) map entering the top stages -> (N, 1280) pooled features."""
        return self.global_pool(self.bn2(self.conv_head(self.stages(features))))


class TextTop(torch.nn.Module):
    """The top layers of a Hugging Face BERT and the mean over real tokens."""

    def __init__(self, bert: torch.nn.Module, top_layers: int = TEXT_TOP_LAYERS):
        super().__init__()
        self.config = bert.config
        self.layers = torch.nn.ModuleList(bert.encoder.layer[len(bert.encoder.layer) - top_layers:])

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N, L, h) token states and (N, L) 0/1 mask -> (N, h) mean-pooled features."""
        attention = attention_mask_for(self.config, states, mask)
        for layer in self.layers:
            states = layer(states, attention)
        return mean_pool(states, mask)


class TowersTop(torch.nn.Module):
    """Tower tops plus heads of a `TowersDualEncoder`: cached intermediates -> unit embeddings.

    Trainable: the top stage and head convolution of the image tower, the top two text
    layers, both heads and the logit scale (`encoder.unlock_top_blocks(1, 2)`); the
    BatchNorm statistics stay frozen, as in every regime of the towers.
    """

    def __init__(self, encoder: TowersDualEncoder):
        super().__init__()
        top_blocks = sum(len(stage) for stage in encoder.image_tower.model.blocks[-IMAGE_TOP_STAGES:])
        self.unlocked_blocks = (top_blocks, TEXT_TOP_LAYERS)
        """Image blocks and text layers trained (`TowersDualEncoder.unlock_top_blocks`)."""
        encoder.unlock_top_blocks(*self.unlocked_blocks)
        self.encoder = encoder
        self.image_top = ImageTop(encoder.image_tower.model)
        self.text_top = TextTop(encoder.text_tower.model)

    @property
    def logit_scale(self) -> torch.nn.Parameter:
        return self.encoder.logit_scale

    @property
    def embed_dim(self) -> int:
        return self.encoder.embed_dim

    def pretrained_parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters that start pretrained (the top layers), which train at a scaled learning rate."""
        return [p for p in [*self.image_top.parameters(), *self.text_top.parameters()] if p.requires_grad]

    def state_dict(self, *args, **kwargs):
        """The encoder's own state: the tops are its modules under a second name, saved once."""
        return self.encoder.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.encoder.load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True) -> TowersTop:
        """The encoder decides which parts follow `mode` (its BatchNorm layers never do)."""
        self.training = mode
        self.encoder.train(mode)
        return self

    def encode_image_states(self, features: torch.Tensor) -> torch.Tensor:
        """(N, 192, 7, 7) cached maps -> (N, d) unit image embeddings."""
        features = features.to(self.encoder.device, torch.float32).contiguous(memory_format=torch.channels_last)
        return F.normalize(self.encoder.image_head(self.image_top(features)), dim=-1)

    def encode_text_states(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N, L, 384) cached token states and (N, L) 0/1 mask -> (N, d) unit text embeddings."""
        device = self.encoder.device
        return F.normalize(self.encoder.text_head(self.text_top(states.to(device, torch.float32), mask.to(device))), dim=-1)

    def forward(self, image_features: torch.Tensor, text_states: torch.Tensor, text_mask: torch.Tensor):
        """Training pass: (B, 192, 7, 7), (B, L, 384), (B, L) -> (B, d), (B, d) unit vectors and
        `logit_scale.exp()`, as `TowersDualEncoder.forward_features` on pooled features."""
        return (self.encode_image_states(image_features), self.encode_text_states(text_states, text_mask),
                self.logit_scale.exp())


def save_top_checkpoint(top: TowersTop, path: str | Path) -> Path:
    """The trained top layers, heads and logit scale as a `lace-towers` heads checkpoint."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return save_heads_checkpoint(top.encoder, path)


__all__ = ["IMAGE_CUT_SHAPE", "IMAGE_TOP_STAGES", "TEXT_TOP_LAYERS", "ImageTop", "TextTop", "TowersTop",
           "image_below_top", "save_top_checkpoint", "text_below_top"]
