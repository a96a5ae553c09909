"""Embed paths: one class per kind of training data, chosen once by the dataset a run is given.

- `PixelPath`: `ImagePairs` (read from `config.run.data`) or in-memory `TensorPairs`, through the whole encoder;
- `FeaturePath`: `FeaturePairs`, cached pooled tower features, through the heads of a `lace-towers` encoder;
- `TopPath`: `TopPairs`, cached inputs of the tower tops, through a trainable `TowersTop`.
"""

from __future__ import annotations

import logging
import math

from lace.data import ImageTextDataset, read_dataset
from lace.data.images import apply_image_policy
from lace.distributed import DistributedContext
from lace.encoders import DualEncoder
from lace.errors import LaceInputError
from lace.train.config import TrainConfig
from lace.train.data import FeaturePairs, ImagePairs, TensorPairs, TopPairs
from lace.train.paths.base import EmbedPath, MicroBatch, Run
from lace.train.paths.features import FeaturePath
from lace.train.paths.pixels import PixelPath
from lace.train.paths.tops import TopPath

logger = logging.getLogger(__name__)

TrainingPairs = ImagePairs | TensorPairs | FeaturePairs | TopPairs
"""What a run trains on: images read through a dataset, in-memory pixels, cached features or cached tower-top inputs."""

PATHS: dict[type, type[EmbedPath]] = {ImagePairs: PixelPath, TensorPairs: PixelPath, FeaturePairs: FeaturePath,
                                      TopPairs: TopPath}
"""The embed path of each kind of training pairs."""


def embed_path(run: Run) -> EmbedPath:
    """The embed path of the run's pairs."""
    return PATHS[type(run.pairs)](run)


def training_pairs(dataset, config: TrainConfig, encoder: DualEncoder,
                   context: DistributedContext) -> tuple[TrainingPairs, int]:
    """The pairs a run trains on and the count of image files skipped as missing or unreadable
    (`lace.data.images`): `dataset` itself when it is in-memory or cached pairs, else `ImagePairs` over it (None:
    read `config.run.data`)."""
    if isinstance(dataset, (TensorPairs, FeaturePairs, TopPairs)):
        return dataset, 0
    if dataset is None:
        if config.run.data is None:
            raise LaceInputError("train config: field 'data': expected a dataset path (--data)")
        dataset = read_dataset(config.run.data, split=config.run.split, image_root=config.run.image_root,
                               csv_columns=(config.run.csv_img_key, config.run.csv_caption_key, config.run.csv_separator))
    if not isinstance(dataset, ImageTextDataset):
        raise LaceInputError(f"train(): expected an ImageTextDataset or TensorPairs, got {type(dataset).__name__}")
    dataset, check = apply_image_policy(dataset, config.run.on_missing_image)
    missing = len(check.bad)
    if missing and context.is_main:
        logger.warning("%s", check.summary())
    pairs = ImagePairs(dataset, encoder.preprocess_train, config.run.seed,
                       skip_unreadable=config.run.on_missing_image == "skip", cache_images=config.run.cache_images)
    return pairs, missing


def total_steps(config: TrainConfig, pairs: TrainingPairs, order) -> int:
    """Optimiser steps of a run: `config.run.steps`, or `--epochs` passes counted as open_clip_train counts them, over
    the rows (image-caption pairs) of data read from a file, over the images of in-memory pairs and cached features
    (the studies' heads and tower tops) as `order` (a `TrainingOrder`) draws them."""
    if config.run.epochs is None:
        return config.run.steps
    batches = max(1, sum(pairs.n_captions) // config.run.batch_size) if isinstance(pairs, ImagePairs) else \
        order.batches_per_epoch
    return math.ceil(config.run.epochs * batches / config.optim.grad_accumulation)


__all__ = ["PATHS", "EmbedPath", "FeaturePath", "MicroBatch", "PixelPath", "Run", "TopPath", "TrainingPairs", "embed_path",
           "total_steps", "training_pairs"]
