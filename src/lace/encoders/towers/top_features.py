"""Intermediate tower features below the trainable tops, cached on disk as float16 `.npy`.

What `lace.encoders.towers.top.TowersTop` reads instead of pixels and token ids:

- `image-top-<key>.npy`: (N_img, 192, 7, 7) float16, the EfficientNet-Lite0 map entering
  stage 6 (the output of stage 5, block 15 of 16), one per record;
- `text-top-<key>.npy`: (T, 384) float16, the MiniLM token states entering layer 4 of 0..5,
  for every real token ([CLS] and [SEP] included) of every caption, captions one after
  another; `text-top-<key>-offsets.npy` (N_txt + 1,) int64 gives caption i the rows
  offsets[i]:offsets[i + 1], so its attention mask is all ones over that length.

Each file has a `.json` beside it, with the measured extraction time and the cosine
between the pooled tower features computed from float32 and from the stored float16
intermediates (first batch). Keys are built as in `lace.encoders.towers.features`, with
a fingerprint of the tower weights below the cut only: training the top layers does
not invalidate the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.lib.format import open_memmap

from lace.data.dataset import ImageRows, ImageTextDataset
from lace.encoders.towers import image_tower
from lace.encoders.towers.features import cache_key, tower_fingerprint
from lace.encoders.towers.model import TowersDualEncoder
from lace.encoders.towers.top import (
    IMAGE_CUT_SHAPE,
    IMAGE_TOP_STAGES,
    TEXT_TOP_LAYERS,
    ImageTop,
    TextTop,
    TowersTop,
    image_below_top,
    text_below_top,
)
from lace.errors import LaceInputError
from lace.io import atomic_path, atomic_write_json, open_npy
from lace.manifest import entry_manifest, verify, write_manifest
from lace.progress import bar as progress_bar

STORAGE_DTYPE = np.float16


@dataclass
class TokenStates:
    """Ragged cached token states: (T, h) rows, caption i owning offsets[i]:offsets[i + 1]."""

    states: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def batch(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions `rows` -> (B, L, h) float32 states zero-padded to the longest, and (B, L) 0/1 mask."""
        rows = [int(r) for r in rows]
        lengths = [int(self.offsets[r + 1] - self.offsets[r]) for r in rows]
        longest = max(lengths, default=0)
        states = torch.zeros(len(rows), longest, self.states.shape[1])
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for i, (row, length) in enumerate(zip(rows, lengths)):
            start = int(self.offsets[row])
            states[i, :length] = torch.from_numpy(np.asarray(self.states[start:start + length], dtype=np.float32))
            mask[i, :length] = 1
        return states, mask


def image_cache_path(encoder: TowersDualEncoder, dataset: ImageTextDataset, cache_dir: str | Path) -> Path:
    model = encoder.image_tower.model
    top = tuple(f"blocks.{i}." for i in range(len(model.blocks) - IMAGE_TOP_STAGES, len(model.blocks)))
    items = [f"{record.image_path}::{record.tar_member or ''}" for record in dataset.records]
    tower_id = f"{encoder.image_tower.tower_id}:below-top-{IMAGE_TOP_STAGES}-stages"
    fingerprint = tower_fingerprint(model, top + ("conv_head.", "bn2.", "classifier."))
    return Path(cache_dir) / f"image-top-{cache_key(tower_id, fingerprint, items)}.npy"


def text_cache_path(encoder: TowersDualEncoder, captions: list[str], cache_dir: str | Path) -> Path:
    bert = encoder.text_tower.model
    n_layers = len(bert.encoder.layer)
    top = tuple(f"encoder.layer.{i}." for i in range(n_layers - TEXT_TOP_LAYERS, n_layers)) + ("pooler.",)
    tower_id = f"{encoder.text_tower.tower_id}:max-tokens-{encoder.text_tower.max_tokens}:below-top-{TEXT_TOP_LAYERS}-layers"
    return Path(cache_dir) / f"text-top-{cache_key(tower_id, tower_fingerprint(bert, top), list(captions))}.npy"


def _float16_cosine(pooled32: torch.Tensor, pooled16: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(pooled32, pooled16, dim=1).min())


def _write_description(path: Path, description: dict) -> None:
    """The entry's `.json`, then its manifest (the maps or token states, their offsets, the description)."""
    atomic_write_json(path.with_suffix(".json"), description)
    write_manifest(path.parent, _entry_files(path), name=entry_manifest(path).name)


def _entry_files(path: Path) -> list[str]:
    """The files of the cache entry `path` (the maps or token states): itself, its offsets if any, its `.json`."""
    return [p.name for p in (path, offsets_path(path), path.with_suffix(".json")) if p.is_file()]


def compute_image_top_features(encoder: TowersDualEncoder, dataset: ImageTextDataset, path: Path,
                               batch_size: int = 64, num_workers: int = 1, progress: bool = False) -> dict:
    """Write the (N_img, 192, 7, 7) float16 maps of every record to `path`; return the description."""
    model = encoder.image_tower.model
    top = ImageTop(model).eval()
    loader = torch.utils.data.DataLoader(
        ImageRows(dataset, encoder.preprocess, draft=image_tower.RESIZE_SIZE),
        batch_size=batch_size, num_workers=num_workers, shuffle=False,
    )
    started, start, min_cosine = time.perf_counter(), 0, None
    with atomic_path(path) as tmp, torch.inference_mode():
        output = open_memmap(tmp, mode="w+", dtype=STORAGE_DTYPE, shape=(len(dataset), *IMAGE_CUT_SHAPE))
        for pixels in progress_bar(loader, desc="image tower below the top", unit="batch", enabled=progress):
            maps = image_below_top(model, pixels.contiguous(memory_format=torch.channels_last)).float()
            stored = maps.to(torch.float16)
            output[start:start + len(maps)] = stored.cpu().numpy()
            if min_cosine is None:
                min_cosine = _float16_cosine(top(maps), top(stored.float()))
            start += len(maps)
        output.flush()
        del output
    seconds = time.perf_counter() - started
    description = {
        "tower": encoder.image_tower.tower_id, "cut": f"input of timm stage {len(model.blocks) - IMAGE_TOP_STAGES}",
        "shape": [len(dataset), *IMAGE_CUT_SHAPE], "dtype": "float16", "source": dataset.source,
        "seconds": seconds, "images_per_second": len(dataset) / max(seconds, 1e-9),
        "torch_threads": torch.get_num_threads(), "min_pooled_cosine_float16_vs_float32_first_batch": min_cosine,
    }
    _write_description(path, description)
    return description


def caption_states_below_top(encoder: TowersDualEncoder, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """N captions -> (N, L, 384) float32 token states entering the text top and their (N, L) 0/1 mask, padded to the
    longest caption: the tower's own tokenisation through its locked layers below the cut (`text_below_top`), on the
    encoder's device. The one path to token states, for the cache and for captions outside it."""
    tokens = encoder.tokenize(list(captions)).to(encoder.device)
    mask = (tokens != encoder.text_tower.pad_token_id).long()
    return text_below_top(encoder.text_tower.model, tokens, mask), mask


def fresh_token_states(encoder: TowersDualEncoder, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token states of captions outside the cache, as the cache would hold them: (N, L, 384) float32 states rounded
    through the storage dtype, zero at padding (as `TokenStates.batch` pads), and the (N, L) 0/1 mask. No gradient:
    the layers below the cut are locked. Bound to an encoder (`functools.partial(fresh_token_states, encoder)`), it is
    the `state_encoder` of `lace.train.TopPairs`, which the pairs layout writes its described captions with."""
    with torch.no_grad():
        states, mask = caption_states_below_top(encoder, captions)
    stored = states.to(torch.float16).float()  # STORAGE_DTYPE, as `compute_text_top_features` stores them
    return stored * mask[..., None], mask


def compute_text_top_features(encoder: TowersDualEncoder, captions: list[str], path: Path,
                              batch_size: int = 256, progress: bool = False) -> dict:
    """Write the ragged (T, 384) float16 token states of `captions` and their offsets; return the description."""
    bert = encoder.text_tower.model
    top = TextTop(bert).eval()
    lengths = encoder.text_tower.token_counts(captions)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    by_length = sorted(range(len(captions)), key=lambda i: lengths[i])  # little padding per batch
    started, min_cosine = time.perf_counter(), None
    with atomic_path(path) as tmp, torch.inference_mode():
        output = open_memmap(tmp, mode="w+", dtype=STORAGE_DTYPE, shape=(int(offsets[-1]), bert.config.hidden_size))
        for start in progress_bar(range(0, len(captions), batch_size), desc="text tower below the top",
                                  unit="batch", enabled=progress):
            rows = by_length[start:start + batch_size]
            states, mask = caption_states_below_top(encoder, [captions[i] for i in rows])
            if not np.array_equal(mask.sum(1).cpu().numpy(), lengths[rows]):
                raise LaceInputError(f"{path}: batched tokenisation disagrees with per-caption lengths")
            stored = states.to(torch.float16)
            for i, row in enumerate(rows):
                output[offsets[row]:offsets[row + 1]] = stored[i, :lengths[row]].cpu().numpy()
            if min_cosine is None:
                min_cosine = _float16_cosine(top(states, mask), top(stored.float(), mask))
        output.flush()
        del output
    seconds = time.perf_counter() - started
    with atomic_path(offsets_path(path)) as tmp, open(tmp, "wb") as handle:
        np.save(handle, offsets)
    description = {
        "tower": encoder.text_tower.tower_id, "cut": f"input of layer {len(bert.encoder.layer) - TEXT_TOP_LAYERS}",
        "captions": len(captions), "tokens": int(offsets[-1]), "dtype": "float16",
        "first_item": captions[0] if captions else None, "seconds": seconds,
        "captions_per_second": len(captions) / max(seconds, 1e-9), "torch_threads": torch.get_num_threads(),
        "min_pooled_cosine_float16_vs_float32_first_batch": min_cosine,
    }
    _write_description(path, description)
    return description


def encode_captions(top: TowersTop, token_states: TokenStates, rows, chunk: int = 64) -> torch.Tensor:
    """(B, d) unit text embeddings of cached captions `rows`, in their order.

    Captions run through the top layers in length-sorted chunks, each padded to its own
    longest caption: every caption's embedding depends on its own tokens only, so this
    equals one padded batch and computes about half as many padded token states.
    """
    rows = np.asarray(rows)
    lengths = token_states.offsets[rows + 1] - token_states.offsets[rows]
    order = np.argsort(lengths, kind="stable")
    parts = [top.encode_text_states(*token_states.batch(rows[order[i:i + chunk]])) for i in range(0, len(rows), chunk)]
    return torch.cat(parts)[torch.from_numpy(np.argsort(order))]


def offsets_path(path: Path) -> Path:
    return path.with_name(path.stem + "-offsets.npy")


def _load(path: Path, expected_rows: int, what: str) -> np.ndarray:
    entry = path.with_name(path.name.removesuffix("-offsets.npy") + ".npy") if path.name.endswith("-offsets.npy") else path
    verify(path.parent, (path.name,), manifest=entry_manifest(entry))
    array = open_npy(path, f"cached {what} (delete the file to recompute it)")
    if array.shape[0] != expected_rows:
        raise LaceInputError(f"{path}: cached {what} with {array.shape[0]} rows, expected {expected_rows}")
    return array


def cached_image_top_features(encoder: TowersDualEncoder, dataset: ImageTextDataset, cache_dir: str | Path,
                              batch_size: int = 64, num_workers: int = 1, progress: bool = False) -> np.ndarray:
    """(N_img, 192, 7, 7) float16 read-only memory map, computed and cached on the first call."""
    path = image_cache_path(encoder, dataset, cache_dir)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        compute_image_top_features(encoder, dataset, path, batch_size, num_workers, progress)
    maps = _load(path, len(dataset), "image maps")
    if maps.shape[1:] != IMAGE_CUT_SHAPE:
        raise LaceInputError(f"{path}: cached image maps of shape {maps.shape}, expected (N, {IMAGE_CUT_SHAPE})")
    return maps


def cached_text_top_features(encoder: TowersDualEncoder, captions: list[str], cache_dir: str | Path,
                             batch_size: int = 256, progress: bool = False) -> TokenStates:
    """Ragged token states of `captions` (read-only memory maps), computed and cached on the first call."""
    captions = list(captions)
    path = text_cache_path(encoder, captions, cache_dir)
    if not path.is_file() or not offsets_path(path).is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        compute_text_top_features(encoder, captions, path, batch_size, progress)
    offsets = np.asarray(_load(offsets_path(path), len(captions) + 1, "token offsets"))
    if offsets[0] != 0 or (np.diff(offsets) <= 0).any():
        raise LaceInputError(f"{offsets_path(path)}: token offsets must start at 0 and increase (every caption "
                             "has a token); delete the file to recompute it")
    states = _load(path, int(offsets[-1]), "token states")
    return TokenStates(states=states, offsets=offsets)


__all__ = ["TokenStates", "cached_image_top_features", "cached_text_top_features", "caption_states_below_top",
           "encode_captions", "fresh_token_states", "image_cache_path", "text_cache_path"]
