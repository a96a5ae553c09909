"""Embedding in-memory world pixels with a model, in batches, without gradient (captions: `lace.embeddings.embed_texts`)."""

from __future__ import annotations

import torch

from lace.encoders.base import DualEncoder


@torch.no_grad()
def embed_pixels(encoder: DualEncoder, pixels: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """(N, 3, H, W) -> (N, d) unit vectors."""
    encoder.eval()
    return torch.cat([encoder.encode_images(pixels[i: i + batch_size]) for i in range(0, len(pixels), batch_size)])
