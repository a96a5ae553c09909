"""Embeddings on disk: extraction from a dataset, and a memory-mapped store.

A store is a folder:
    image_embeddings.npy   (N_img, d) float32 unit vectors
    text_embeddings.npy    (N_txt, d) float32 unit vectors
    index.json             image_ids, captions, text_image_index, model, data

`.npy` files open with `mmap_mode="r"`, so a 600k x 512 pool never has to sit in
memory at once. Extraction writes into memory-mapped files as it goes, inside a hidden
temporary folder renamed into place at the end; under `torchrun` each rank embeds a
contiguous shard and rank 0 merges them.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from lace.data.dataset import ImageTextDataset
from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.io import atomic_write_json, read_json

IMAGE_FILE = "image_embeddings.npy"
TEXT_FILE = "text_embeddings.npy"
INDEX_FILE = "index.json"


@dataclass
class EmbeddingStore:
    """A folder of image and text embeddings, memory-mapped on open."""

    path: Path
    image_embeddings: np.ndarray
    """(N_img, d) float32, memory-mapped read-only."""
    text_embeddings: np.ndarray
    """(N_txt, d) float32, memory-mapped read-only."""
    index: dict

    @classmethod
    def open(cls, path: str | Path) -> EmbeddingStore:
        path = Path(path)
        for name in (IMAGE_FILE, TEXT_FILE, INDEX_FILE):
            if not (path / name).is_file():
                raise LaceInputError(f"{path / name}: file not found; expected an embedding store written by `lace embed`")
        index = read_json(path / INDEX_FILE)
        images = np.load(path / IMAGE_FILE, mmap_mode="r")
        texts = np.load(path / TEXT_FILE, mmap_mode="r")
        for key in ("image_ids", "captions", "text_image_index"):
            if key not in index:
                raise LaceInputError(f"{path / INDEX_FILE}: field '{key}' missing")
        if images.shape[0] != len(index["image_ids"]) or texts.shape[0] != len(index["captions"]):
            raise LaceInputError(
                f"{path}: embeddings and index disagree: {images.shape[0]} images / {len(index['image_ids'])} ids, "
                f"{texts.shape[0]} texts / {len(index['captions'])} captions"
            )
        if images.shape[1] != texts.shape[1]:
            raise LaceInputError(f"{path}: image dimension {images.shape[1]} != text dimension {texts.shape[1]}")
        return cls(path, images, texts, index)

    @property
    def dim(self) -> int:
        return int(self.image_embeddings.shape[1])

    @property
    def captions(self) -> list[str]:
        return self.index["captions"]

    @property
    def text_image_index(self) -> np.ndarray:
        """(N_txt,) row of each caption's image."""
        return np.asarray(self.index["text_image_index"], dtype=np.int64)


def write_store(
    path: str | Path, image_embeddings: np.ndarray, text_embeddings: np.ndarray, index: dict
) -> EmbeddingStore:
    """Write in-memory embeddings as a store (atomically: a temporary folder renamed into place)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / IMAGE_FILE, np.ascontiguousarray(image_embeddings, dtype=np.float32))
    np.save(tmp / TEXT_FILE, np.ascontiguousarray(text_embeddings, dtype=np.float32))
    atomic_write_json(tmp / INDEX_FILE, index)
    _replace_dir(tmp, path)
    return EmbeddingStore.open(path)


def _replace_dir(tmp: Path, path: Path) -> None:
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


class _ImageFolderView(Dataset):
    def __init__(self, dataset: ImageTextDataset, indices: range, transform):
        self.dataset, self.indices, self.transform = dataset, indices, transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(self.dataset.load_image(self.indices[i]))


def _shard(n: int, rank: int, world_size: int) -> range:
    return range(n * rank // world_size, n * (rank + 1) // world_size)


@torch.no_grad()
def embed_images(
    encoder: DualEncoder, dataset: ImageTextDataset, out: np.ndarray | None = None,
    indices: range | None = None, batch_size: int = 64, num_workers: int = 0, progress: bool = True,
) -> np.ndarray:
    """Embed the images of `dataset` (rows `indices`, default all) into `out` (len(indices), d)."""
    indices = indices if indices is not None else range(len(dataset))
    out = out if out is not None else np.empty((len(indices), encoder.embed_dim), dtype=np.float32)
    loader = DataLoader(_ImageFolderView(dataset, indices, encoder.preprocess), batch_size=batch_size,
                        num_workers=num_workers)
    row = 0
    encoder.eval()
    for pixels in tqdm(loader, desc="embed images", unit="batch", disable=not progress):
        embeddings = encoder.encode_images(pixels).float().cpu().numpy()
        out[row: row + len(embeddings)] = embeddings
        row += len(embeddings)
    return out


@torch.no_grad()
def embed_texts(
    encoder: DualEncoder, captions: list[str], out: np.ndarray | None = None,
    batch_size: int = 256, progress: bool = True,
) -> np.ndarray:
    """Embed `captions` into `out` (len(captions), d) unit vectors."""
    out = out if out is not None else np.empty((len(captions), encoder.embed_dim), dtype=np.float32)
    encoder.eval()
    for start in tqdm(range(0, len(captions), batch_size), desc="embed texts", unit="batch", disable=not progress):
        batch = captions[start: start + batch_size]
        out[start: start + len(batch)] = encoder.encode_texts(batch).float().cpu().numpy()
    return out


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def extract_embeddings(
    encoder: DualEncoder, dataset: ImageTextDataset, out_dir: str | Path, *, model_name: str,
    batch_size: int = 64, num_workers: int = 0, progress: bool = True,
) -> EmbeddingStore | None:
    """Embed every image and caption of `dataset` into an embedding store at `out_dir`.

    Streams into memory-mapped `.npy` files. In a torch.distributed run each rank embeds
    a contiguous shard; rank 0 merges them and returns the store (other ranks return None).
    The caller is responsible for refusing to clobber `out_dir`.
    """
    out_dir = Path(out_dir)
    rank, world_size = _distributed()
    captions = dataset.captions
    image_rows = _shard(len(dataset), rank, world_size)
    text_rows = _shard(len(captions), rank, world_size)
    work = out_dir.with_name(f".{out_dir.name}.tmp")
    shard_dir = work / f"rank{rank:05d}"
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
    if world_size > 1:
        torch.distributed.barrier()
    shard_dir.mkdir(parents=True, exist_ok=True)
    dim = encoder.embed_dim
    images = np.lib.format.open_memmap(shard_dir / IMAGE_FILE, mode="w+", dtype=np.float32, shape=(len(image_rows), dim))
    texts = np.lib.format.open_memmap(shard_dir / TEXT_FILE, mode="w+", dtype=np.float32, shape=(len(text_rows), dim))
    embed_images(encoder, dataset, images, image_rows, batch_size, num_workers, progress and rank == 0)
    embed_texts(encoder, captions[text_rows.start: text_rows.stop], texts, batch_size * 4, progress and rank == 0)
    images.flush()
    texts.flush()
    del images, texts
    if world_size > 1:
        torch.distributed.barrier()
    if rank != 0:
        return None
    if world_size > 1:
        _merge_shards(work, world_size, (len(dataset), len(captions), dim))
    else:
        for name in (IMAGE_FILE, TEXT_FILE):
            os.replace(shard_dir / name, work / name)
        shutil.rmtree(shard_dir)
    index = {
        "model": model_name,
        "data": dataset.source,
        "image_ids": [record.image_id for record in dataset.records],
        "image_paths": [str(record.image_path) + (f":{record.tar_member}" if record.tar_member else "")
                        for record in dataset.records],
        "captions": captions,
        "text_image_index": dataset.caption_image_index,
    }
    atomic_write_json(work / INDEX_FILE, index)
    _replace_dir(work, out_dir)
    return EmbeddingStore.open(out_dir)


def _merge_shards(work: Path, world_size: int, sizes: tuple[int, int, int]) -> None:
    n_images, n_texts, dim = sizes
    for name, rows in ((IMAGE_FILE, n_images), (TEXT_FILE, n_texts)):
        merged = np.lib.format.open_memmap(work / name, mode="w+", dtype=np.float32, shape=(rows, dim))
        row = 0
        for rank in range(world_size):
            part = np.load(work / f"rank{rank:05d}" / name, mmap_mode="r")
            merged[row: row + len(part)] = part
            row += len(part)
        merged.flush()
        del merged
    for rank in range(world_size):
        shutil.rmtree(work / f"rank{rank:05d}")


def describe_store(store: EmbeddingStore) -> str:
    return json.dumps({"images": int(store.image_embeddings.shape[0]), "texts": int(store.text_embeddings.shape[0]),
                       "dim": store.dim, "model": store.index.get("model")})
