"""Embeddings of benchmark images and captions, computed once per run.

Benchmarks share images (SugarCrepe's seven files use the same COCO photos) and
captions; the cache embeds each distinct (image path, crop box) and each distinct
caption once. It can be saved to and loaded from an `.npz` file, so a second run of
the same model on the same data embeds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lace.data.dataset import open_rgb
from lace.embeddings import embed_texts
from lace.encoders.base import DualEncoder
from lace.encoders.preprocess import preprocess_images
from lace.errors import LaceInputError
from lace.io import atomic_path
from lace.progress import bar as progress_bar

Box = tuple[float, float, float, float]
ImageKey = tuple[str, Box | None]
"""An image file and an optional crop box (x, y, width, height) in pixels."""


def load_image(key: ImageKey) -> Image.Image:
    """Open an image as RGB and crop it to the key's box, with a clear error when missing."""
    path, box = key
    image = open_rgb(path)
    if box is not None:
        x, y, width, height = box
        image = image.crop((x, y, x + width, y + height))
    return image


def _key_text(key: ImageKey) -> str:
    return json.dumps([key[0], list(key[1]) if key[1] is not None else None])


class EmbeddingCache:
    """Unit embeddings of images (by path and crop) and captions for one encoder.

    `pixels`: preprocessed (3, H, W) pixels by image key, read and filled here; pass one dict
    to the caches of several encoders with the same `preprocess` (checkpoints of one
    architecture) so that each image is decoded once for all of them.
    """

    def __init__(self, encoder: DualEncoder, batch_size: int = 64, progress: bool = False,
                 pixels: dict[str, torch.Tensor] | None = None):
        self.encoder = encoder
        self.batch_size = batch_size
        self.progress = progress
        self.pixels = pixels
        self._images: dict[str, torch.Tensor] = {}
        self._texts: dict[str, torch.Tensor] = {}

    def _pixels(self, name: str) -> torch.Tensor:
        """(3, H, W) preprocessed pixels of the image `name`, through the shared `pixels` when given."""
        if self.pixels is None:
            return self.encoder.preprocess(load_image(_parse_key(name)))
        if name not in self.pixels:
            self.pixels[name] = self.encoder.preprocess(load_image(_parse_key(name)))
        return self.pixels[name]

    @torch.no_grad()
    def images(self, keys: Sequence[ImageKey]) -> torch.Tensor:
        """(N, d) unit embeddings of the images named by `keys`, in order."""
        names = [_key_text(key) for key in keys]
        todo = list(dict.fromkeys(name for name in names if name not in self._images))
        if todo:
            self.encoder.eval()
            batches = range(0, len(todo), self.batch_size)
            for start in progress_bar(batches, desc="embed images", unit="batch", enabled=self.progress):
                batch = todo[start: start + self.batch_size]
                pixels = torch.stack([self._pixels(name) for name in batch])
                embeddings = self.encoder.encode_images(pixels).float().cpu()
                self._images.update(zip(batch, embeddings))
        if not names:
            return torch.empty(0, self.encoder.embed_dim)
        return torch.stack([self._images[name] for name in names])

    @torch.no_grad()
    def texts(self, captions: Sequence[str]) -> torch.Tensor:
        """(N, d) unit embeddings of `captions`, in order."""
        todo = list(dict.fromkeys(c for c in captions if c not in self._texts))
        if todo:
            embeddings = embed_texts(self.encoder, todo, batch_size=self.batch_size * 4, progress=self.progress)
            self._texts.update(zip(todo, torch.from_numpy(embeddings)))
        if not captions:
            return torch.empty(0, self.encoder.embed_dim)
        return torch.stack([self._texts[c] for c in captions])

    @property
    def sizes(self) -> dict[str, int]:
        return {"images": len(self._images), "texts": len(self._texts)}

    def save(self, path: str | Path) -> None:
        """Write every embedding so far to an `.npz` file (atomically)."""
        dim = self.encoder.embed_dim
        image_names, text_names = list(self._images), list(self._texts)
        arrays = {
            "image_keys": np.array(json.dumps(image_names)),
            "text_keys": np.array(json.dumps(text_names)),
            "images": torch.stack(list(self._images.values())).numpy() if image_names else np.zeros((0, dim), np.float32),
            "texts": torch.stack(list(self._texts.values())).numpy() if text_names else np.zeros((0, dim), np.float32),
        }
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)

    def load(self, path: str | Path) -> None:
        """Add the embeddings saved at `path` (written by `save` for the same model and data)."""
        try:
            with np.load(path) as data:
                image_names, text_names = json.loads(str(data["image_keys"])), json.loads(str(data["text_keys"]))
                images, texts = torch.from_numpy(data["images"]), torch.from_numpy(data["texts"])
        except (OSError, KeyError, ValueError) as error:
            raise LaceInputError(f"{path}: not an embedding cache written by lace eval ({error})") from error
        if images.shape[0] and images.shape[1] != self.encoder.embed_dim:
            raise LaceInputError(f"{path}: cached dimension {images.shape[1]} != model dimension {self.encoder.embed_dim}")
        self._images.update(zip(image_names, images))
        self._texts.update(zip(text_names, texts))


def _parse_key(name: str) -> ImageKey:
    path, box = json.loads(name)
    return path, tuple(box) if box is not None else None


def decode_images(keys: Sequence[ImageKey], preprocess, pixels: dict[str, torch.Tensor]) -> None:
    """Put the (3, H, W) `preprocess`ed pixels of each image of `keys` not there yet into `pixels`, named as the
    caches given `pixels` (`EmbeddingCache(pixels=...)`) look them up: images decoded ahead, once for every model
    of one architecture."""
    todo = {name: key for name, key in ((_key_text(key), key) for key in keys) if name not in pixels}
    pixels.update(zip(todo, preprocess_images(preprocess, [load_image(key) for key in todo.values()])))
