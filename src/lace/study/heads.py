"""Heads-only training on cached tower features, through the project trainer.

With the towers locked, running them every step would recompute identical tower features,
so the study hands `lace.train.train` the cached features (`FeaturePairs`) and its
`lace-towers` encoder: the trainer's seeded `TrainingOrder` (every variant sees the same
pairs in the same batches), counterfactual and rule-made caption negatives, `lace_loss`,
open_clip's AdamW grouping, the cosine schedule, gradient clipping and the logit-scale clamp.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lace.config import with_changes
from lace.edits.config import EditConfig
from lace.encoders.towers import (
    TowersConfig,
    TowersDualEncoder,
    read_checkpoint,
)
from lace.experiment.variants import variant_config
from lace.study.config import HeadsTraining
from lace.study.features import SplitFeatures
from lace.train import TrainConfig, train
from lace.train.config import train_config
from lace.train.data import FeaturePairs


@dataclass
class CaptionNegatives:
    """Tower features of one rule-made negative per training caption: (N_txt, 384) and (N_txt,) bool."""

    features: torch.Tensor
    valid: torch.Tensor


def heads_train_config(settings: HeadsTraining, n_images: int, seed: int, variant: str, edit: EditConfig,
                       vocabulary: str, output: str | Path) -> TrainConfig:
    """The `TrainConfig` of one heads run: `settings`' delta (`HeadsTraining.train_changes`), the editor's settings
    `edit` (its M), `variant`'s switches."""
    config = train_config(model="lace-towers", output=str(output), overwrite=True, device="cpu", seed=seed,
                          edit=edit, vocabulary=vocabulary, checkpoint_every=0,
                          keep_checkpoints=1, log_every=1, precision="fp32")
    config = with_changes(config, {**settings.train_changes(), "batch_size": min(settings.batch_size, n_images)})
    return variant_config(config, variant)


def train_summary(config: TrainConfig, progress: bool, **inputs) -> dict:
    """Train `config` in a scratch run folder (`lace.train.train` with `inputs`: dataset, encoder, editors);
    the run's summary from its metrics."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lace-run-") as folder:
        result = train(with_changes(config, {"output": str(Path(folder) / "run")}), progress=progress, console=False,
                       **inputs)
        steps = [json.loads(line) for line in result.metrics_path.read_text(encoding="utf-8").splitlines()]
    tail = steps[-max(1, len(steps) // 10):]
    summary = {"steps": result.steps, "seconds": time.perf_counter() - started,
               "final_loss": float(np.mean([s["loss"] for s in tail])), "logit_scale": steps[-1]["logit_scale"]}
    arm = config.arm
    sides = {"caption": arm.caption_negatives or arm.counterfactual_captions or arm.local_caption_swaps,
             "image": arm.uses_image_edits}
    for side in (side for side, made in sides.items() if made):  # the share of rows with a valid negative
        summary[f"{side}_negative_rows"] = float(np.mean([s[f"{side}_negatives_valid_rows"] for s in steps]))
    for key, name in (("pair_rows_valid", "pair_rows"), ("rule_collision_rows", "rule_collision_rows")):
        if key in steps[-1]:  # the pairs layout: the share of rows with an edited row, and of rows whose described
            summary[name] = float(np.mean([s[key] for s in steps]))  # caption is also their rule-made negative
    return summary


def train_on_features(encoder: TowersDualEncoder, train_split: SplitFeatures, settings: HeadsTraining, seed: int,
                      variant: str = "plain", editor=None, edit: EditConfig | None = None,
                      caption_negatives: CaptionNegatives | None = None, vocabulary: str = "natural",
                      progress: bool = False) -> dict:
    """Train `encoder`'s heads and logit scale in place with `lace.train.train`; return a summary of the run.

    `edit`: the settings of `editor` (its M, `edit.n_edits`, counterfactuals per embedding and side); default
    `EditConfig()`.

    The data order depends only on `seed`, the number of images and the batch size.
    """
    pairs = FeaturePairs(train_split.image_features, train_split.text_features, train_split.caption_image_index,
                         caption_negatives.features if caption_negatives else None,
                         caption_negatives.valid if caption_negatives else None)
    config = heads_train_config(settings, len(pairs), seed, variant, edit or EditConfig(), vocabulary, "run")
    summary = train_summary(config, progress, dataset=pairs, encoder=encoder, editor=editor)
    encoder.eval()
    # the locked study's records give both shares, 0 for a side the variant makes no negative on
    return {"caption_negative_rows": 0.0, "image_negative_rows": 0.0, **summary}


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
    encoder.replace_heads(config)
    encoder.eval()
    return encoder


def load_heads(encoder: TowersDualEncoder, path: str | Path) -> TowersDualEncoder:
    """Put the heads of a checkpoint written by `save_heads_checkpoint` into `encoder` (towers untouched)."""
    tensors, metadata = read_checkpoint(path)
    config = TowersConfig(**json.loads(metadata["towers_config"]))
    fresh_heads(encoder, HeadsTraining(hidden_dim=config.head_hidden_dim, dropout=config.head_dropout,
                                       embed_dim=config.embed_dim), seed=0)
    encoder.load_state_dict(tensors, strict=False)
    encoder.eval()
    return encoder
