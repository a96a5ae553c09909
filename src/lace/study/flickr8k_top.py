"""Flickr8k with the tops of the towers trainable: the cached inputs of the tops, split by split, and the base.

The towers run once up to a cut below their tops (`lace.encoders.towers.top_features` caches what enters
the tops); the layers above the cut train with the heads through the project trainer on those cached
inputs (`lace.train.TopPairs`). The base trains only the heads, on the pooled features the pretrained tops
give, as the locked-tower study trains its base; `lace.study.flickr8k_top_arms` fine-tunes every arm from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torchvision import transforms

from lace.data.dataset import ImageRows
from lace.data.flickr8k import read_flickr8k
from lace.encoders.towers import (
    TokenStates,
    TowersDualEncoder,
    TowersTop,
    cached_image_top_features,
    cached_text_top_features,
    encode_captions,
    image_tower,
)
from lace.encoders.towers.top import image_below_top
from lace.eval.metrics import retrieval_recall
from lace.local.cut_recolour import CutPhotographs, photo_prototypes
from lace.study.config import HeadsTraining
from lace.study.features import SplitFeatures, split_rows
from lace.study.heads import fresh_heads, train_on_features


@dataclass
class TopSplit:
    """Cached inputs of the tops for one split (or a subset of its images).

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


def top_splits(data: str, cache: str, encoder: TowersDualEncoder, progress: bool = True) -> dict[str, TopSplit]:
    """Cached inputs of the tops for Flickr8k's train, val and test splits (images in split order); extracted,
    with progress bars, on the first call."""
    dataset = read_flickr8k(data)
    maps = cached_image_top_features(encoder, dataset, cache, progress=progress)
    tokens = cached_text_top_features(encoder, dataset.captions, cache, progress=progress)
    return {name: TopSplit(name, np.asarray(maps[rows]), tokens, keep, owner)
            for name, (rows, keep, owner) in split_rows(dataset).items()}


def cut_photographs(data: str, split: str, count: int, colour_names: list[str]) -> CutPhotographs:
    """The first `count` photographs of a Flickr8k split as the cached maps were made from them (decoded, resized and
    cropped as the cache's extraction does), in [0, 1], with the image tower below the cut (normalisation included)
    and the RGB prototypes of `colour_names`: what the learnt map operator learns from
    (`lace.local.cut_recolour.fit_cut_operator`)."""
    dataset = read_flickr8k(data)
    rows = split_rows(dataset)[split][0][:count]
    steps = image_tower.eval_transform().transforms
    raw_rows = ImageRows(dataset, transforms.Compose(steps[:-1]), rows, draft=image_tower.RESIZE_SIZE)
    raw = torch.stack([raw_rows[i] for i in range(len(raw_rows))])  # (N, 3, 224, 224) in [0, 1]
    model, normalise = TowersDualEncoder().eval().image_tower.model, steps[-1]
    return CutPhotographs(raw, lambda pixels: image_below_top(model, normalise(pixels)), photo_prototypes(colour_names))


@torch.no_grad()
def embed_top_split(top: TowersTop, split: TopSplit, batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_img, d) and (N_txt, d) unit embeddings of a split through the tops and heads."""
    top.eval()
    images = torch.cat([top.encode_image_states(torch.from_numpy(split.image_maps[i:i + batch_size].astype(np.float32)))
                        for i in range(0, len(split.image_maps), batch_size)])
    texts = encode_captions(top, split.token_states, split.caption_rows, chunk=batch_size)
    return images, texts


def recall_of(images: torch.Tensor, texts: torch.Tensor, split: TopSplit) -> dict[str, float]:
    """Retrieval figures of a split's (N_img, d) and (N_txt, d) embeddings, with the mean R@1 of both ways."""
    figures = retrieval_recall(images, texts, split.caption_image_index)
    return {**figures, "mean_R@1": 0.5 * (figures["i2t/R@1"] + figures["t2i/R@1"])}


@torch.no_grad()
def pooled_features(top: TowersTop, split: TopSplit, batch_size: int = 512) -> SplitFeatures:
    """The pooled tower features of a split, (N_img, 1280) and (N_txt, 384), through `top`'s layers."""
    top.eval()
    images = torch.cat([top.image_top(torch.from_numpy(split.image_maps[i:i + batch_size].astype(np.float32)))
                        for i in range(0, len(split.image_maps), batch_size)])
    rows = split.caption_rows
    order = np.argsort(split.token_states.offsets[rows + 1] - split.token_states.offsets[rows], kind="stable")
    texts = torch.cat([top.text_top(*split.token_states.batch(rows[order[i:i + batch_size]]))
                       for i in range(0, len(rows), batch_size)])[torch.from_numpy(np.argsort(order))]
    return SplitFeatures(split.name, images, texts, [""] * len(texts), split.caption_image_index, [""] * len(images))


def heads_base(top: TowersTop, split: TopSplit, settings: HeadsTraining, progress: bool = False) -> dict:
    """Train only the heads of `top` (top layers locked at their pretrained weights), on the
    pooled features of `split`, as the locked-tower study trains its base."""
    encoder = top.encoder
    encoder.unlock_top_blocks(0, 0)
    fresh_heads(encoder, settings, seed=0)
    summary = train_on_features(encoder, pooled_features(top, split), settings, seed=0, progress=progress)
    encoder.unlock_top_blocks(*top.unlocked_blocks)
    return summary


def base_images(n_train: int, share: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of the training images: (base rows, fine-tune rows)."""
    permuted = np.random.default_rng(seed).permutation(n_train)
    cut = round(share * n_train)
    return np.sort(permuted[:cut]), np.sort(permuted[cut:])


__all__ = ["TopSplit", "base_images", "cut_photographs", "embed_top_split", "heads_base", "pooled_features", "recall_of", "top_splits"]
