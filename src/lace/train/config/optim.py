"""`OptimConfig`: the optimiser, its schedule and its gradient steps."""

from __future__ import annotations

from dataclasses import dataclass

from lace.errors import input_error


@dataclass
class OptimConfig:
    """AdamW with a linear warm-up and a cosine decay, gradient clipping and accumulation."""

    lr: float = 1e-5
    """Peak learning rate of AdamW (1e-5 suits fine-tuning a pretrained CLIP; ~1e-3 from scratch)."""
    pretrained_lr_scale: float = 1.0
    """Learning rate of the pretrained layers an encoder names (the tower tops of a `TowersTop`) as a fraction of
    lr; its new heads and the logit scale take lr."""
    weight_decay: float = 0.1
    """AdamW weight decay; biases, norms, 1-d params and logit_scale get none (open_clip's rule)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.98
    """AdamW beta2 (0.98 as in CLIP)."""
    eps: float = 1e-6
    """AdamW epsilon."""
    warmup_steps: int = 50
    """Linear warm-up steps before the cosine decay."""
    grad_clip_norm: float | None = 1.0
    """Clip the global gradient norm to this value (None: no clipping)."""
    grad_accumulation: int = 1
    """Batches per optimiser step; each batch is its own contrastive loss, gradients averaged."""

    def validate(self, where: str = "train config") -> OptimConfig:
        """Raise `LaceInputError` naming the field on an impossible setting; return self."""
        if self.grad_accumulation < 1:
            raise input_error(where, "grad_accumulation", "a positive integer", self.grad_accumulation)
        if self.warmup_steps < 0:
            raise input_error(where, "warmup_steps", "a non-negative integer", self.warmup_steps)
        if self.lr <= 0 or self.pretrained_lr_scale < 0:
            raise input_error(where, "lr / pretrained_lr_scale", "lr > 0 and pretrained_lr_scale >= 0",
                              (self.lr, self.pretrained_lr_scale))
        return self
