"""Embedding in-memory world pixels and captions with a model, in batches, without gradient."""

from __future__ import annotations

import torch

from lace.encoders.base import DualEncoder


@torch.no_grad()
def embed_pixels(encoder: DualEncoder, pixels: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """(N, 3, H, W) -> (N, d) unit vectors."""
    encoder.eval()
    return torch.cat([encoder.encode_images(pixels[i: i + batch_size]) for i in range(0, len(pixels), batch_size)])


@torch.no_grad()
def embed_captions(encoder: DualEncoder, captions: list[str], batch_size: int = 1024) -> torch.Tensor:
    """N captions -> (N, d) unit vectors."""
    encoder.eval()
    return torch.cat([encoder.encode_texts(captions[i: i + batch_size]) for i in range(0, len(captions), batch_size)])
