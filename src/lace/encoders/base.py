"""The one interface every model in lace is used through."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
import torch.nn.functional as F
from PIL import Image


class DualEncoder(torch.nn.Module, ABC):
    """A CLIP-style image tower and text tower mapping into one shared space.

    Every `encode_*` method returns unit vectors of shape (N, d), always, and keeps
    the autograd graph (wrap calls in `torch.no_grad()` for inference). `forward`
    is what training calls, so `DistributedDataParallel` can wrap the encoder itself.
    """

    name: str
    preprocess: Callable[[Image.Image], torch.Tensor]
    """Evaluation transform: PIL image -> (3, H, W) float tensor."""
    preprocess_train: Callable[[Image.Image], torch.Tensor]
    """Training transform (may augment): PIL image -> (3, H, W) float tensor."""

    @property
    @abstractmethod
    def embed_dim(self) -> int:
        """Dimension d of the shared space."""

    @property
    @abstractmethod
    def logit_scale(self) -> torch.nn.Parameter:
        """The learned temperature as a log-scale parameter; logits use `logit_scale.exp()`."""

    @property
    def logit_bias(self) -> torch.nn.Parameter | None:
        """The learned logit bias b of sigmoid-loss models (SigLIP: logits `s u.v + b`); None for CLIP-style
        models. It shifts every logit alike, so rankings by cosine do not see it."""
        return None

    @abstractmethod
    def tokenize(self, texts: list[str]) -> torch.Tensor:
        """Texts -> token ids (N, L) on the CPU."""

    @abstractmethod
    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) preprocessed pixels -> (N, d) raw, unnormalised features."""

    @abstractmethod
    def text_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, L) token ids -> (N, d) raw, unnormalised features."""

    @abstractmethod
    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict of the original architecture, loadable by its own library."""

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) preprocessed pixels -> (N, d) unit vectors."""
        return F.normalize(self.image_features(pixels.to(self.device)), dim=-1)

    def encode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, L) token ids -> (N, d) unit vectors."""
        return F.normalize(self.text_features(tokens.to(self.device)), dim=-1)

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """N captions -> (N, d) unit vectors."""
        return self.encode_tokens(self.tokenize(list(texts)))

    def forward(
        self, pixels: torch.Tensor, tokens: torch.Tensor,
        encode_images: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass: (B, d) image and (B, d) text unit vectors, and `logit_scale.exp()`.

        encode_images: the image pass to run instead of `self.encode_images` ((B, 3, H, W) pixels on the
        model's device -> (B, d) unit vectors with gradient), for a step that makes more of the image
        tower's pass than U (LACE-local's edited maps); it runs inside this call, so a data-parallel
        wrapper sees it as part of the forward pass.
        """
        images = self.encode_images(pixels) if encode_images is None else encode_images(pixels.to(self.device))
        return images, self.encode_tokens(tokens), self.logit_scale.exp()
