"""Which concept each position at L shows, learnt from the concepts paired captions mention.

A linear reader on standardised position features gives each position a distribution over
"nothing" and the G concepts of one attribute group (the colours, say). Captions say which
concepts an image shows but not where, so the reader is fitted as a multiple-instance model:
an image shows concept c with probability `1 - prod_p (1 - p_c(p))` (noisy-OR over positions),
and that is fitted to the caption mentions by logistic loss. No scene graph is read.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _noisy_or_loss(shown: Tensor, targets: Tensor) -> Tensor:
    """Mean binary cross-entropy of the noisy-OR presence `1 - prod_p (1 - shown_p)` against (N, G) targets, in
    log space: with `S = sum_p log(1 - shown_p)`, `log(present) = log(-expm1(S))` and `log(1 - present) = S`.
    Clamping the presence instead would zero the gradient of every image it saturates the wrong way, and a fit
    on more images could then stop in such a state for good. shown (N, P, G)."""
    absent = torch.log1p(-shown.clamp(max=1 - 1e-6)).sum(dim=1)  # (N, G) = S <= 0
    log_present = torch.log(-torch.expm1(absent.clamp(max=-1e-12)))
    return -(targets * log_present + (1 - targets) * absent).mean()


class PositionConceptReader:
    """Per-position concept probabilities for one attribute group.

    steps, lr: Adam steps and learning rate of the fit; random_state: seed of the start.
    Learned state: `mean_`, `scale_` (C,) standardisation, `weight_` (C, 1 + G), `bias_` (1 + G,)
    (class 0 is "no concept"), `mention_loss_` the final training loss, `nothing_mean_` (C,) the mean
    feature of training positions read as showing no concept.
    """

    def __init__(self, steps: int = 400, lr: float = 0.05, random_state: int = 0):
        self.steps = steps
        self.lr = lr
        self.random_state = random_state

    def fit(self, features: Tensor, mentions: Tensor) -> PositionConceptReader:
        """features (N, P, C) of training images; mentions (N, G) bool, the concepts their captions name."""
        if features.ndim != 3 or mentions.shape[0] != features.shape[0]:
            raise ValueError(f"expected features (N, P, C) and mentions (N, G), got {tuple(features.shape)} "
                             f"and {tuple(mentions.shape)}")
        features = features.detach().float()
        rows = features.reshape(-1, features.shape[-1])
        self.mean_, self.scale_ = rows.mean(0), rows.std(0).clamp_min(1e-6)
        standard = (features - self.mean_) / self.scale_
        targets = mentions.float().to(features.device)
        generator = torch.Generator().manual_seed(self.random_state)  # the same start on every device
        weight = 0.01 * torch.randn(features.shape[-1], 1 + targets.shape[1], generator=generator)
        weight = weight.to(features.device).requires_grad_()
        bias = torch.zeros(1 + targets.shape[1], device=features.device, requires_grad=True)
        optimiser = torch.optim.Adam([weight, bias], lr=self.lr)
        with torch.enable_grad():
            for _ in range(self.steps):
                shown = torch.softmax(standard @ weight + bias, dim=-1)[..., 1:]  # (N, P, G)
                loss = _noisy_or_loss(shown, targets)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        self.weight_, self.bias_ = weight.detach(), bias.detach()
        self.mention_loss_ = float(loss.detach())
        nothing = self.probabilities(features)[..., 0] > 0.5  # (N, P) positions that show no concept
        self.nothing_mean_ = features[nothing].mean(0) if nothing.any() else self.mean_
        return self

    def probabilities(self, features: Tensor) -> Tensor:
        """(..., C) features -> (..., 1 + G) probabilities; class 0 is "no concept"; no gradient."""
        standard = (features.detach().float() - self.mean_.to(features.device)) / self.scale_.to(features.device)
        logits = standard @ self.weight_.to(features.device) + self.bias_.to(features.device)
        # softmax by hand: torch.softmax over a last dimension this short is ten times slower on the CPU
        exponentials = (logits - logits.amax(dim=-1, keepdim=True)).exp_()
        return exponentials / exponentials.sum(dim=-1, keepdim=True)

    def presence(self, features: Tensor, probabilities: Tensor | None = None) -> Tensor:
        """(B, P, C) features -> (B, G) probability that the image shows each concept (noisy-OR);
        probabilities: `self.probabilities(features)` when already computed."""
        shown = (self.probabilities(features) if probabilities is None else probabilities)[..., 1:]
        return 1 - torch.exp(torch.log1p(-shown.clamp(max=1 - 1e-6)).sum(dim=1))

    def state_dict(self) -> dict:
        """The fitted reader as plain tensors and numbers (what a `weights_only` checkpoint load reads back)."""
        return {"steps": self.steps, "lr": self.lr, "random_state": self.random_state, "mean": self.mean_,
                "scale": self.scale_, "weight": self.weight_, "bias": self.bias_, "nothing_mean": self.nothing_mean_,
                "mention_loss": self.mention_loss_}

    @classmethod
    def from_state(cls, state: dict) -> PositionConceptReader:
        """The fitted reader `state_dict()` describes, its tensors as they were saved."""
        reader = cls(state["steps"], state["lr"], state["random_state"])
        reader.mean_, reader.scale_ = state["mean"], state["scale"]
        reader.weight_, reader.bias_ = state["weight"], state["bias"]
        reader.nothing_mean_, reader.mention_loss_ = state["nothing_mean"], float(state["mention_loss"])
        return reader
