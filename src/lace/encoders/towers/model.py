"""`lace-towers`: pretrained image and text towers with trainable heads, as a `DualEncoder`.

Two training regimes:
- towers locked (LiT style, the default): only the heads and the logit scale learn,
  so training can run on tower features computed once and cached
  (`lace.encoders.towers.features`), through `head_image` / `head_text`;
- top blocks unlocked: `unlock_top_blocks(n_image, n_text)` lets the top n blocks of
  each tower learn as well (training then needs pixels and tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lace.encoders.base import DualEncoder
from lace.encoders.towers import image_tower, text_tower
from lace.encoders.towers.heads import ProjectionHead

MODEL_NAME = "lace-towers"


@dataclass(frozen=True)
class TowersConfig:
    """Shape of the heads of a `lace-towers` model."""

    embed_dim: int = 256
    """Dimension d of the shared space."""
    head_hidden_dim: int = 2048
    """Hidden width of the MLP heads; 0 makes each head one linear map."""
    head_dropout: float = 0.5
    """Dropout inside the MLP heads (training only)."""
    init_logit_scale: float = math.log(1 / 0.07)
    """Initial log temperature, CLIP's 1/0.07."""

    def __post_init__(self):
        if self.embed_dim < 1 or self.head_hidden_dim < 0 or not 0.0 <= self.head_dropout < 1.0:
            raise ValueError(
                "TowersConfig: expected embed_dim >= 1, head_hidden_dim >= 0 and 0 <= head_dropout < 1, "
                f"got {self.embed_dim}, {self.head_hidden_dim}, {self.head_dropout}"
            )


class TowersDualEncoder(DualEncoder):
    """EfficientNet-Lite0 + all-MiniLM-L6-v2 towers, projection heads, a learnable logit scale.

    Tower features: (N, 1280) for images, (N, 384) for texts. Heads map them to (N, d).
    """

    name = MODEL_NAME

    def __init__(self, config: TowersConfig = TowersConfig(), pretrained_towers: bool = True):
        super().__init__()
        self.image_tower = image_tower.ImageTower(pretrained=pretrained_towers)
        # channels_last runs the depthwise convolutions of this tower faster on CPU (measured).
        self.image_tower.to(memory_format=torch.channels_last)
        self.text_tower = text_tower.TextTower()
        self._logit_scale = torch.nn.Parameter(torch.tensor(float(config.init_logit_scale)))
        self.replace_heads(config)
        self.preprocess = image_tower.eval_transform()
        self.preprocess_train = image_tower.train_transform()
        self.unlocked_blocks = (0, 0)
        self.unlock_top_blocks(0, 0)

    def replace_heads(self, config: TowersConfig) -> TowersDualEncoder:
        """New heads and logit scale of the shape and start `config` gives (drawn from the global random stream);
        the towers stay."""
        self.config = config
        self.image_head = ProjectionHead(image_tower.FEATURE_DIM, config.embed_dim, config.head_hidden_dim,
                                         config.head_dropout)
        self.text_head = ProjectionHead(text_tower.FEATURE_DIM, config.embed_dim, config.head_hidden_dim,
                                        config.head_dropout)
        with torch.no_grad():
            self._logit_scale.fill_(config.init_logit_scale)
        return self

    # --- DualEncoder -------------------------------------------------------------------
    @property
    def embed_dim(self) -> int:
        return self.config.embed_dim

    @property
    def logit_scale(self) -> torch.nn.Parameter:
        return self._logit_scale

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self.text_tower.tokenize(texts)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, 224, 224) pixels -> (N, d) raw head outputs."""
        return self.image_head(self.image_tower_features(pixels))

    def text_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, L) token ids -> (N, d) raw head outputs."""
        return self.text_head(self.text_tower_features(tokens))

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """Towers, heads and logit scale; `load_encoder("lace-towers", pretrained=file)` reads it back."""
        return {key: value.detach().clone().contiguous() for key, value in self.state_dict().items()}

    # --- towers and heads apart --------------------------------------------------------
    def image_tower_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, 224, 224) pixels -> (N, 1280) image tower features."""
        pixels = pixels.to(self.device).contiguous(memory_format=torch.channels_last)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.unlocked_blocks[0] > 0):
            return self.image_tower(pixels)

    def text_tower_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, L) token ids -> (N, 384) text tower features."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.unlocked_blocks[1] > 0):
            return self.text_tower(tokens.to(self.device))

    def head_image(self, features: torch.Tensor) -> torch.Tensor:
        """(N, 1280) image tower features (e.g. cached) -> (N, d) unit vectors."""
        return F.normalize(self.image_head(features.to(self.device, torch.float32)), dim=-1)

    def head_text(self, features: torch.Tensor) -> torch.Tensor:
        """(N, 384) text tower features (e.g. cached) -> (N, d) unit vectors."""
        return F.normalize(self.text_head(features.to(self.device, torch.float32)), dim=-1)

    def forward_features(
        self, image_features: torch.Tensor, text_features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass on tower features: (B, 1280), (B, 384) -> (B, d), (B, d) unit vectors,
        and `logit_scale.exp()`; the cached-feature counterpart of `forward`."""
        return self.head_image(image_features), self.head_text(text_features), self.logit_scale.exp()

    # --- training regimes ----------------------------------------------------------------
    def unlock_top_blocks(self, n_image: int = 0, n_text: int = 0) -> None:
        """Let the top `n_image` of the 16 image blocks and `n_text` of the 6 text layers learn.

        (0, 0) locks both towers (LiT style). Unlocking any image block also unlocks the
        image tower's final 1x1 convolution above the blocks. BatchNorm statistics stay
        frozen in every regime: contrastive batches are too small to re-estimate them.
        """
        image_blocks, text_layers = self.image_tower.blocks, self.text_tower.layers
        if not (0 <= n_image <= len(image_blocks) and 0 <= n_text <= len(text_layers)):
            raise ValueError(
                f"unlock_top_blocks: expected 0 <= n_image <= {len(image_blocks)} and "
                f"0 <= n_text <= {len(text_layers)}, got {n_image}, {n_text}"
            )
        self.image_tower.requires_grad_(False)
        self.text_tower.requires_grad_(False)
        unlocked = image_blocks[len(image_blocks) - n_image:] if n_image else []
        if n_image:
            unlocked += [self.image_tower.model.conv_head, self.image_tower.model.bn2]
        unlocked += text_layers[len(text_layers) - n_text:] if n_text else []
        for module in unlocked:
            module.requires_grad_(True)
        self.unlocked_blocks = (n_image, n_text)
        self.train(self.training)

    def train(self, mode: bool = True) -> TowersDualEncoder:
        """Heads follow `mode`; locked tower parts and all BatchNorm layers stay in eval mode."""
        super().train(mode)
        self.image_tower.eval()
        self.text_tower.eval()
        if mode:
            n_image, n_text = self.unlocked_blocks
            for block in self.image_tower.blocks[len(self.image_tower.blocks) - n_image:] if n_image else []:
                block.train()
                for module in block.modules():
                    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                        module.eval()
            for layer in self.text_tower.layers[len(self.text_tower.layers) - n_text:] if n_text else []:
                layer.train()
        return self

    @property
    def tower_ids(self) -> dict[str, str]:
        return {"image": self.image_tower.tower_id, "text": self.text_tower.tower_id}
