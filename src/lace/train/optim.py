"""AdamW with open_clip's weight-decay rule, and its cosine schedule with linear warm-up."""

from __future__ import annotations

import math

import torch

# CLIP's own cap on the temperature: logits are at most 100 x cosine.
MAX_LOGIT_SCALE = math.log(100.0)
FUSED_DEVICES = ("cpu", "cuda")
"""Devices where `torch.optim.AdamW(fused=True)` runs."""


def excluded_from_weight_decay(name: str, parameter: torch.nn.Parameter) -> bool:
    """open_clip's rule (open_clip_train/main.py): gains, biases, norms and the temperature."""
    return parameter.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name


def build_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], eps: float,
    scaled: frozenset[int] = frozenset(), lr_scale: float = 1.0,
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, no decay for those `excluded_from_weight_decay` picks.

    scaled: ids of parameters whose learning rate is `lr_scale` x the schedule's (pretrained layers fine-tuned
    beside new heads); each group records its `lr_scale`, which `set_lr` applies.

    PyTorch's fused kernel where the parameters live on a device that has one (CPU, CUDA): one pass
    over each tensor instead of the per-tensor loop PyTorch picks on CPU by default, about 3x
    cheaper a step than even the foreach loop (on CPU foreach runs op by op; 18 of the demo base's
    87 ms a step went to it). It moves the parameters as the per-tensor loop does, to float
    rounding (tests/test_train.py). Elsewhere, the foreach loop.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    fused = all(p.device.type in FUSED_DEVICES for _, p in named)
    groups = []
    for first, scale, members in ((True, 1.0, [(n, p) for n, p in named if id(p) not in scaled]),
                                  (False, lr_scale, [(n, p) for n, p in named if id(p) in scaled])):
        if not (first or members):  # runs without scaled layers keep the two groups they always had
            continue
        no_decay = [p for n, p in members if excluded_from_weight_decay(n, p)]
        decay = [p for n, p in members if not excluded_from_weight_decay(n, p)]
        groups += [{"params": no_decay, "weight_decay": 0.0, "lr_scale": scale},
                   {"params": decay, "weight_decay": weight_decay, "lr_scale": scale}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None,
                             foreach=None if fused else True)


def cosine_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate of optimiser step `step` (0-based), as open_clip's `cosine_lr`."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(step - warmup_steps, decay_steps) / decay_steps
    return 0.5 * (1.0 + math.cos(math.pi * progress)) * base_lr


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Each group's learning rate: the schedule's `lr` times the group's `lr_scale` (1 where it has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def clamp_logit_scale(logit_scale: torch.nn.Parameter) -> None:
    """Keep the log temperature in [0, ln 100], as CLIP and open_clip do after each step."""
    with torch.no_grad():
        logit_scale.clamp_(0, MAX_LOGIT_SCALE)
