"""Which contrastive loss a run trains with, chosen by the model and stated in the run.

Models with a learned logit bias (open_clip configs with `init_logit_bias`: the SigLIP and SigLIP 2
family, `lace-micro-sigmoid-32`; Hugging Face `SiglipModel`) were trained with the sigmoid loss and
train with it by default; every other model trains with the softmax CLIP loss. `TrainConfig.loss`
overrides the choice: `clip` on a model with a bias trains it as CLIP would and leaves the bias unused
(frozen: it would get no gradient, which data-parallel training refuses; probabilities read from it go
stale); `sigmoid` on a model without one is refused, since there is no bias to learn or export.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from lace.encoders import DualEncoder
from lace.errors import LaceInputError
from lace.losses import clip_loss, lace_loss, sigmoid_loss
from lace.train.config import TrainConfig

logger = logging.getLogger(__name__)


def logit_bias_of(encoder: DualEncoder | torch.nn.Module) -> torch.nn.Parameter | None:
    """The encoder's learned logit bias, or None (CLIP-style models, and trainable modules such as the tower
    tops that are not `DualEncoder`s)."""
    return getattr(encoder, "logit_bias", None)


def choose_loss(config: TrainConfig, encoder: DualEncoder, log: bool = True) -> TrainConfig:
    """`config` with `loss` resolved from `auto` to `clip` or `sigmoid` for `encoder` (what the run's
    config.json then records); logs the choice, and warns when `clip` leaves a logit bias unused, which it
    then freezes (`requires_grad` off: no optimiser state, and nothing for data-parallel training to wait for)."""
    bias = logit_bias_of(encoder)
    has_bias = bias is not None
    loss = config.run.loss
    if loss == "sigmoid" and not has_bias:
        raise LaceInputError(
            f"train config: field 'loss': sigmoid needs a model with a logit bias (an open_clip config with "
            f"init_logit_bias such as ViT-B-16-SigLIP2 or lace-micro-sigmoid-32, or hf-siglip:<folder>); "
            f"{config.run.model} has none: use --loss clip")
    if loss == "auto":
        loss = "sigmoid" if has_bias else "clip"
        if has_bias and log:
            logger.warning("train: %s has a logit bias (a SigLIP-style model): training with the sigmoid loss "
                           "(--loss clip for the softmax CLIP loss)", config.run.model)
    elif loss == "clip" and has_bias:
        bias.requires_grad_(False)
        if log:
            logger.warning("train: --loss clip on %s, a model with a logit bias: the softmax loss does not use "
                           "the bias, which stays at %.3f untrained (sigmoid probabilities read from it will not "
                           "match the fine-tuned logits)", config.run.model,
                           float(bias.detach().float().reshape(-1)[0]))
    return replace(config, run=replace(config.run, loss=loss))


def contrastive_losses(loss: str, U: torch.Tensor, V: torch.Tensor, logit_scale: torch.Tensor,
                       logit_bias: torch.Tensor | None, negatives, weight: float,
                       **gallery) -> tuple[torch.Tensor, torch.Tensor]:
    """The training loss of one micro-batch (`loss`: clip or sigmoid) with the counterfactual negatives of
    `negatives` (a `lace.train.negatives.Negatives`), and its plain part without gradient.

    `gallery`: `gallery_images`, `gallery_texts`, `row_offset` and `false_negatives`, as the losses take them.
    """
    extra = (negatives.caption_negatives, negatives.caption_valid, negatives.image_negatives,
             negatives.image_valid)
    if loss == "sigmoid":
        total = sigmoid_loss(U, V, logit_scale, *extra, weight=weight, logit_bias=logit_bias, **gallery)
        with torch.no_grad():
            plain = sigmoid_loss(U, V, logit_scale, logit_bias=logit_bias, **gallery)
        return total, plain
    total = lace_loss(U, V, logit_scale, *extra, weight=weight, **gallery)
    with torch.no_grad():
        plain = clip_loss(U, V, logit_scale, **gallery)
    return total, plain
