"""Training glue for `TowersTop` on cached intermediates: the contrastive loop of every arm, and embedding.

The one place that feeds cached image maps and token states to a `TowersTop`; it follows
the project trainer (seeded `TrainingOrder`, cosine schedule with warm-up, AdamW with
open_clip's decay rule, logit-scale clamp, `lace_loss`; no gradient clipping), with one learning
rate for the heads and a scaled one for the pretrained top layers. Meant to move onto the
project trainer's cached-feature path when it has one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from lace.encoders.towers.top import TowersTop
from lace.encoders.towers.top_features import TokenStates, encode_captions
from lace.losses import lace_loss
from lace.study.top_negatives import TopNegativeSources, batch_negatives, top_arm
from lace.train.data import TrainingOrder, caption_rows_by_image
from lace.train.optim import clamp_logit_scale, cosine_lr, excluded_from_weight_decay


@dataclass(frozen=True)
class TopTraining:
    """One training run of tower tops and heads on cached intermediates."""

    hidden_dim: int = 2048
    """Hidden width of the MLP heads (0: linear heads)."""
    dropout: float = 0.5
    """Dropout inside the heads."""
    embed_dim: int = 256
    lr: float = 1e-3
    """Peak AdamW learning rate of the heads and the logit scale."""
    top_lr_scale: float = 0.1
    """The top layers' learning rate as a fraction of `lr` (they start pretrained)."""
    weight_decay: float = 0.1
    epochs: float = 10.0
    """Passes over the training images (one caption drawn per image per epoch)."""
    batch_size: int = 256
    warmup_steps: int = 20
    init_temperature: float = 0.07


@dataclass
class TopSplit:
    """Cached intermediates of one split (or a subset of its images).

    image_maps: (N_img, 192, 7, 7) float16; token_states: all captions of the dataset;
    caption_rows: (N_txt,) rows of this split's captions in `token_states`;
    caption_image_index: (N_txt,) image row (within the split) of each caption.
    """

    name: str
    image_maps: np.ndarray
    token_states: TokenStates
    caption_rows: np.ndarray
    caption_image_index: np.ndarray

    def subset(self, image_rows: np.ndarray, name: str) -> TopSplit:
        """The images `image_rows` of this split and their captions."""
        local = np.full(len(self.image_maps), -1, dtype=np.int64)
        local[image_rows] = np.arange(len(image_rows))
        keep = local[self.caption_image_index] >= 0
        return TopSplit(name, self.image_maps[image_rows], self.token_states, self.caption_rows[keep],
                        local[self.caption_image_index[keep]])


def _maps(split: TopSplit, rows) -> torch.Tensor:
    return torch.from_numpy(np.asarray(split.image_maps[np.asarray(rows)], dtype=np.float32))


def build_top_optimizer(top: TowersTop, weight_decay: float) -> torch.optim.AdamW:
    """AdamW in four groups (top layers or heads, with or without decay); each group's
    `lr_scale` multiplies the scheduled learning rate."""
    top_ids = {id(p) for p in [*top.image_top.parameters(), *top.text_top.parameters()]}
    groups: dict[tuple[bool, bool], list] = {}
    for name, parameter in top.named_parameters():
        if parameter.requires_grad:
            groups.setdefault((id(parameter) in top_ids, excluded_from_weight_decay(name, parameter)), []).append(parameter)
    return torch.optim.AdamW(
        [{"params": params, "weight_decay": 0.0 if no_decay else weight_decay, "is_top": is_top}
         for (is_top, no_decay), params in groups.items()],
        lr=0.0, betas=(0.9, 0.98), eps=1e-6,
    )


def train_top(top: TowersTop, split: TopSplit, settings: TopTraining, seed: int, arm: str = "plain",
              sources: TopNegativeSources | None = None) -> dict:
    """Train `top` in place with arm `arm` (a `lace.experiment.variants` name) and the negatives it draws
    from `sources`; return a summary of the run.

    The data order depends only on `seed`, the number of images and the batch size; every arm of a
    seed sees the same batches in the same order, and its edits are drawn from generators seeded by `seed`.
    """
    switches, sources = top_arm(arm), sources or TopNegativeSources()
    sources.check(switches, arm)
    torch.manual_seed(seed)  # dropout draws
    edits = torch.Generator().manual_seed(seed)
    if sources.map_editor is not None:
        sources.map_editor.reseed(seed)
    rows_of_image = caption_rows_by_image(split.caption_image_index, len(split.image_maps))
    order = TrainingOrder([len(r) for r in rows_of_image], min(settings.batch_size, len(rows_of_image)), seed)
    total_steps = max(1, math.ceil(settings.epochs * order.batches_per_epoch))
    optimizer = build_top_optimizer(top, settings.weight_decay)
    top.train()
    losses, valid_rows, started = [], {"caption": [], "image": []}, time.perf_counter()
    for step in range(total_steps):
        lr = cosine_lr(step, settings.lr, settings.warmup_steps, total_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr * (settings.top_lr_scale if group["is_top"] else 1.0)
        samples = order.micro_batch(step)
        image_rows = [s.index for s in samples]
        caption_rows = [int(split.caption_rows[rows_of_image[s.index][s.caption]]) for s in samples]
        maps = _maps(split, image_rows)
        U = top.encode_image_states(maps)
        V = encode_captions(top, split.token_states, caption_rows)
        negatives = batch_negatives(top, switches, sources, maps, U, V, np.asarray(caption_rows), edits)
        loss = lace_loss(U, V, top.logit_scale.exp(), negatives.caption_negatives, negatives.caption_valid,
                         negatives.image_negatives, negatives.image_valid)
        for side, valid in (("caption", negatives.caption_valid), ("image", negatives.image_valid)):
            if valid is not None:
                valid_rows[side].append(float(valid.any(dim=1).float().mean()))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        clamp_logit_scale(top.logit_scale)
        losses.append(loss.item())
    top.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {"arm": arm, "steps": total_steps, "seconds": time.perf_counter() - started,
            "final_loss": float(np.mean(tail)), "logit_scale": top.logit_scale.exp().item(),
            **{f"{side}_negative_rows": float(np.mean(shares)) for side, shares in valid_rows.items() if shares}}


@torch.no_grad()
def embed_top_split(top: TowersTop, split: TopSplit, batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_img, d) and (N_txt, d) unit embeddings of a split through the tops and heads."""
    top.eval()
    images = torch.cat([top.encode_image_states(_maps(split, range(i, min(i + batch_size, len(split.image_maps)))))
                        for i in range(0, len(split.image_maps), batch_size)])
    texts = encode_captions(top, split.token_states, split.caption_rows, chunk=batch_size)
    return images, texts


__all__ = ["TopSplit", "TopTraining", "build_top_optimizer", "embed_top_split", "train_top"]
