"""Shared pieces of the tower-top tests: cached inputs of hand-built maps and random token states at the cut's
shape, a trainer of one arm, and a tiny coloured Flickr8k folder (the tiny `TowersTop` and the map editor fitted at
the cut's shape are the `top` and `map_editor` fixtures of conftest.py)."""

from __future__ import annotations

import csv
import random

import numpy as np
import torch
from PIL import Image, ImageDraw

from lace.config import with_changes
from lace.distributed import DistributedContext
from lace.encoders.towers.top import TowersTop
from lace.encoders.towers.top_features import TokenStates
from lace.experiment.variants import variant_config
from lace.study.config import HeadsTraining, TopsFinetune
from lace.train.data import TopPairs
from lace.train.loop import Trainer
from tests.test_local_maps import coloured_maps

ONE_PROCESS = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
CUT_GRID = (7, 7)
CUT_CHANNELS = 192
TINY_HEADS = HeadsTraining(hidden_dim=16, dropout=0.1, embed_dim=8, epochs=1, batch_size=4, warmup_steps=1)
TINY_FINETUNE = with_changes(TopsFinetune(), {"lr": 1e-3, "pretrained_lr_scale": 0.1, "epochs": 1.0, "batch_size": 4,
                                             "warmup_steps": 1, "grad_clip_norm": None, "precision": "fp32"})


def object_maps(n_images: int, seed: int = 1) -> torch.Tensor:
    return coloured_maps(n_images, seed=seed, channels=CUT_CHANNELS, grid=CUT_GRID)[0]


def token_states(n_captions: int, seed: int = 0) -> TokenStates:
    """Random cached token states of `n_captions` captions of 3 to 6 tokens."""
    generator = np.random.default_rng(seed)
    lengths = generator.integers(3, 7, size=n_captions)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return TokenStates(generator.standard_normal((offsets[-1], 384)).astype(np.float16), offsets)


def tiny_pairs(n_images: int = 8, negatives: bool = True) -> TopPairs:
    """n_images cached maps with two captions each, and a rule-made negative for three of every four captions."""
    maps = object_maps(n_images, seed=2).numpy().astype(np.float16)
    owner = np.repeat(np.arange(n_images), 2)
    if not negatives:
        return TopPairs(maps, token_states(2 * n_images), np.arange(2 * n_images), owner)
    return TopPairs(maps, token_states(2 * n_images), np.arange(2 * n_images), owner, token_states(4, seed=1),
                    np.array([0, -1, 1, 2] * (n_images // 2)))


def top_trainer(top: TowersTop, arm: str, tmp_path, pairs: TopPairs | None = None, **inputs) -> Trainer:
    config = variant_config(with_changes(TINY_FINETUNE.train_config(), {"model": "lace-towers", "vocabulary": "natural", "output": str(tmp_path / arm.replace(" ", "-")), "checkpoint_every": 0, "log_every": 1}), arm)
    return Trainer(config, ONE_PROCESS, None, pairs or tiny_pairs(), False, None, encoder=top, **inputs)


PAINTS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 170, 30), "yellow": (230, 220, 40)}
THINGS = ("dog", "ball", "car", "hat")


def make_coloured_flickr8k(root, n_images: int):
    """A Flickr8k folder (`tests.test_flickr8k.make_flickr8k`'s layout) of two coloured objects on grey,
    with two captions per image naming both objects and their colours."""
    (root / "images").mkdir(parents=True)
    rows, colours = [], list(PAINTS)
    for i in range(n_images):
        first, second = colours[i % 4], colours[(i + 1 + i // 4) % 4]
        thing, other = THINGS[i % 4], THINGS[(i + 2) % 4]
        image = Image.new("RGB", (64, 64), (128, 128, 128))
        draw = ImageDraw.Draw(image)
        draw.rectangle((4, 4, 28, 28), fill=PAINTS[first])
        draw.rectangle((36, 34, 60, 60), fill=PAINTS[second])
        name = f"{2000 + i * 7919}_{i:04x}.jpg"
        image.save(root / "images" / name)
        rows += [(name, f"a {first} {thing} and a {second} {other} ."),
                 (name, f"a {second} {other} next to a {first} {thing} .")]
    random.Random(0).shuffle(rows)
    with open(root / "captions.csv", "w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), *rows])
    return root
