"""Heads-only training on cached tower features: the plain loss, LACE and rule negatives.

The project trainer (`lace.train.train`) runs the whole encoder on pixels and tokens
each step; with the towers locked that would recompute identical tower features every
step, so this loop trains the heads on the cached features instead. It keeps the
trainer's pieces: the seeded `TrainingOrder` (every variant sees the same pairs in the
same batches), `counterfactual_negatives` with the frozen editor, `lace_loss`,
open_clip's AdamW grouping, the cosine schedule and the logit-scale clamp.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lace.encoders.towers import image_tower, text_tower
from lace.encoders.towers.checkpoint import read_checkpoint, save_heads_checkpoint
from lace.encoders.towers.heads import ProjectionHead
from lace.encoders.towers.model import TowersConfig, TowersDualEncoder
from lace.losses import lace_loss
from lace.study.config import HeadsTraining
from lace.study.features import SplitFeatures
from lace.train.data import TrainingOrder
from lace.train.negatives import counterfactual_negatives
from lace.train.optim import build_optimizer, clamp_logit_scale, cosine_lr, set_lr


@dataclass
class CaptionNegatives:
    """Tower features of one rule-made negative per training caption: (N_txt, 384) and (N_txt,) bool."""

    features: torch.Tensor
    valid: torch.Tensor


@dataclass(frozen=True)
class Switches:
    """What a run adds to the plain loss."""

    counterfactual_captions: bool = False
    counterfactual_images: bool = False
    rule_negatives: bool = False

    @classmethod
    def of(cls, config) -> Switches:
        """The switches of a `TrainConfig` (its rule-made caption negatives read from cached features)."""
        return cls(config.counterfactual_captions, config.counterfactual_images, config.caption_negatives)


def caption_rows_by_image(caption_image_index: np.ndarray, n_images: int) -> list[np.ndarray]:
    """For each image, the rows of its captions."""
    order = np.argsort(caption_image_index, kind="stable")
    bounds = np.searchsorted(caption_image_index[order], np.arange(n_images + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(n_images)]


def train_heads(
    encoder: TowersDualEncoder,
    train: SplitFeatures,
    settings: HeadsTraining,
    seed: int,
    switches: Switches = Switches(),
    editor=None,
    n_edits: int = 4,
    caption_negatives: CaptionNegatives | None = None,
) -> dict:
    """Train `encoder`'s heads and logit scale in place; return a summary of the run.

    The data order depends only on `seed`, the number of images and the batch size.
    """
    if (switches.counterfactual_captions or switches.counterfactual_images) and editor is None:
        raise ValueError("counterfactual negatives need an editor")
    if switches.rule_negatives and caption_negatives is None:
        raise ValueError("rule negatives need the cached features of rule-made captions")
    torch.manual_seed(seed)  # dropout draws
    rows_of_image = caption_rows_by_image(train.caption_image_index, len(train.image_paths))
    order = TrainingOrder([len(r) for r in rows_of_image], min(settings.batch_size, len(rows_of_image)), seed)
    total_steps = max(1, math.ceil(settings.epochs * order.batches_per_epoch))
    optimizer = build_optimizer(encoder, settings.lr, settings.weight_decay, (0.9, 0.98), 1e-6)
    encoder.train()
    losses, started = [], time.perf_counter()
    valid_rows = {"caption": 0.0, "image": 0.0}
    for step in range(total_steps):
        set_lr(optimizer, cosine_lr(step, settings.lr, settings.warmup_steps, total_steps))
        samples = order.micro_batch(step)
        image_rows = torch.tensor([s.index for s in samples])
        caption_rows = torch.tensor([int(rows_of_image[s.index][s.caption]) for s in samples])
        U, V, scale = encoder.forward_features(train.image_features[image_rows], train.text_features[caption_rows])
        negatives = None
        if editor is not None and (switches.counterfactual_captions or switches.counterfactual_images):
            generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 2, step]).generate_state(1)[0]))
            negatives = counterfactual_negatives(editor, U, V, n_edits, switches.counterfactual_captions,
                                                 switches.counterfactual_images, "dictionary", generator)
        caption_extra, caption_valid = (negatives.caption_negatives, negatives.caption_valid) if negatives else (None, None)
        image_extra, image_valid = (negatives.image_negatives, negatives.image_valid) if negatives else (None, None)
        if switches.rule_negatives:
            made = encoder.head_text(caption_negatives.features[caption_rows]).unsqueeze(1)  # (B, 1, d)
            made_valid = caption_negatives.valid[caption_rows].unsqueeze(1)  # (B, 1)
            caption_extra = made if caption_extra is None else torch.cat([caption_extra, made], dim=1)
            caption_valid = made_valid if caption_valid is None else torch.cat([caption_valid, made_valid], dim=1)
        if caption_valid is not None:
            valid_rows["caption"] += float(caption_valid.any(dim=1).float().mean())
        if image_valid is not None:
            valid_rows["image"] += float(image_valid.any(dim=1).float().mean())
        loss = lace_loss(U, V, scale, caption_extra, caption_valid, image_extra, image_valid)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if settings.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(encoder.parameters(), settings.grad_clip_norm)
        optimizer.step()
        clamp_logit_scale(encoder.logit_scale)
        losses.append(loss.item())
    encoder.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {
        "steps": total_steps, "seconds": time.perf_counter() - started, "final_loss": float(np.mean(tail)),
        "logit_scale": encoder.logit_scale.exp().item(),
        "caption_negative_rows": valid_rows["caption"] / total_steps,
        "image_negative_rows": valid_rows["image"] / total_steps,
    }


@torch.no_grad()
def embed_split(encoder: TowersDualEncoder, split: SplitFeatures, batch_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_img, d) and (N_txt, d) unit embeddings of a split through the heads."""
    encoder.eval()
    images = torch.cat([encoder.head_image(split.image_features[i:i + batch_size])
                        for i in range(0, split.image_features.shape[0], batch_size)])
    texts = torch.cat([encoder.head_text(split.text_features[i:i + batch_size])
                       for i in range(0, split.text_features.shape[0], batch_size)])
    return images, texts


def fresh_heads(encoder: TowersDualEncoder, settings: HeadsTraining, seed: int) -> TowersDualEncoder:
    """Give `encoder` new, seeded heads of the shape `settings` asks for (the towers stay)."""
    config = TowersConfig(embed_dim=settings.embed_dim, head_hidden_dim=settings.hidden_dim,
                          head_dropout=settings.dropout, init_logit_scale=math.log(1 / settings.init_temperature))
    torch.manual_seed(seed)
    encoder.config = config
    encoder.image_head = ProjectionHead(image_tower.FEATURE_DIM, config.embed_dim, config.head_hidden_dim, config.head_dropout)
    encoder.text_head = ProjectionHead(text_tower.FEATURE_DIM, config.embed_dim, config.head_hidden_dim, config.head_dropout)
    with torch.no_grad():
        encoder.logit_scale.fill_(config.init_logit_scale)
    encoder.eval()
    return encoder


def save_heads(encoder: TowersDualEncoder, path: str | Path) -> Path:
    """The heads and logit scale as a `lace-towers` heads checkpoint."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return save_heads_checkpoint(encoder, path)


def load_heads(encoder: TowersDualEncoder, path: str | Path) -> TowersDualEncoder:
    """Put the heads of a checkpoint written by `save_heads` into `encoder` (towers untouched)."""
    tensors, metadata = read_checkpoint(path)
    config = TowersConfig(**json.loads(metadata["towers_config"]))
    fresh_heads(encoder, HeadsTraining(hidden_dim=config.head_hidden_dim, dropout=config.head_dropout,
                                       embed_dim=config.embed_dim), seed=0)
    encoder.load_state_dict(tensors, strict=False)
    encoder.eval()
    return encoder
