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

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from lace.data.dataset import ImageRows, ImageTextDataset
from lace.encoders.base import DualEncoder
from lace.errors import LaceInputError
from lace.io import atomic_write_json, open_npy, read_json, replace_dir
from lace.manifest import verify, write_manifest
from lace.progress import bar as progress_bar

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
        verify(path, (IMAGE_FILE, TEXT_FILE, INDEX_FILE))
        index = read_json(path / INDEX_FILE, dict)
        images = open_npy(path / IMAGE_FILE, "image embeddings")
        texts = open_npy(path / TEXT_FILE, "text embeddings")
        for name, table in ((IMAGE_FILE, images), (TEXT_FILE, texts)):
            if table.ndim != 2 or table.dtype != np.float32:
                raise LaceInputError(f"{path / name}: expected (N, d) float32, got {table.shape} {table.dtype}")
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
    loader = DataLoader(ImageRows(dataset, encoder.preprocess, indices), batch_size=batch_size,
                        num_workers=num_workers)
    row = 0
    encoder.eval()
    for pixels in progress_bar(loader, desc="embed images", unit="batch", enabled=progress):
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
    for start in progress_bar(range(0, len(captions), batch_size), desc="embed texts", unit="batch", enabled=progress):
        batch = captions[start: start + batch_size]
        out[start: start + len(batch)] = encoder.encode_texts(batch).float().cpu().numpy()
    return out


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def extract_embeddings(
    encoder: DualEncoder, dataset: ImageTextDataset, out_dir: str | Path, *, model_name: str,
    batch_size: int = 64, num_workers: int = 0, progress: bool = True, chunk_rows: int = 4096,
) -> EmbeddingStore | None:
    """Embed every image and caption of `dataset` into an embedding store at `out_dir`.

    Streams into memory-mapped `.npy` files inside `.<out>.tmp`, recording after every `chunk_rows`
    rows how far it got: an interrupted extraction (Ctrl-C, a kill) carries on from there when run
    again with the same model weights, data and number of processes. In a torch.distributed run
    each rank embeds a contiguous shard; rank 0 merges them and returns the store (other ranks
    return None). The caller is responsible for refusing to clobber `out_dir`.
    """
    out_dir = Path(out_dir)
    rank, world_size = _distributed()
    captions = dataset.captions
    work = out_dir.with_name(f".{out_dir.name}.tmp")
    key = _extraction_key(encoder, dataset, model_name, world_size)
    if rank == 0 and _read_progress(work / PROGRESS_FILE, key) is None:
        shutil.rmtree(work, ignore_errors=True)  # another extraction's leftovers
        work.mkdir(parents=True)
        atomic_write_json(work / PROGRESS_FILE, {"key": key})
    if world_size > 1:
        torch.distributed.barrier()
    shard = _Shard(work / f"rank{rank:05d}", key, _shard(len(dataset), rank, world_size),
                   _shard(len(captions), rank, world_size), encoder.embed_dim)
    shard.embed(encoder, dataset, captions, batch_size, num_workers, chunk_rows, progress and rank == 0)
    if world_size > 1:
        torch.distributed.barrier()
    if rank != 0:
        return None
    if world_size > 1:
        _merge_shards(work, world_size, (len(dataset), len(captions), encoder.embed_dim))
    else:
        for name in (IMAGE_FILE, TEXT_FILE):
            os.replace(shard.folder / name, work / name)
        shutil.rmtree(shard.folder)
    index = {
        "model": model_name,
        "data": dataset.source,
        "image_ids": [record.image_id for record in dataset.records],
        "image_paths": [str(record.image_path) + (f":{record.tar_member}" if record.tar_member else "")
                        for record in dataset.records],
        "captions": captions,
        "text_image_index": dataset.caption_image_index,
    }
    (work / PROGRESS_FILE).unlink()
    atomic_write_json(work / INDEX_FILE, index)
    write_manifest(work, (IMAGE_FILE, TEXT_FILE, INDEX_FILE))
    replace_dir(work, out_dir)
    return EmbeddingStore.open(out_dir)


PROGRESS_FILE = "progress.json"


def _extraction_key(encoder: DualEncoder, dataset: ImageTextDataset, model_name: str, world_size: int) -> str:
    """SHA-256 of what fixes an extraction's rows: the weights, the images and captions, the processes."""
    digest = hashlib.sha256(json.dumps([model_name, str(dataset.source), world_size, encoder.embed_dim,
                                        [str(r.image_path) for r in dataset.records], dataset.captions]).encode())
    for name, tensor in sorted(encoder.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _read_progress(path: Path, key: str) -> dict | None:
    """The progress record at `path` when it belongs to the extraction `key` (None otherwise)."""
    try:
        record = read_json(path)
    except LaceInputError:
        return None
    return record if isinstance(record, dict) and record.get("key") == key else None


@dataclass
class _Shard:
    """One process's rows of an extraction, in memory-mapped files with a progress record beside them."""

    folder: Path
    key: str
    image_rows: range
    text_rows: range
    dim: int

    def embed(self, encoder: DualEncoder, dataset: ImageTextDataset, captions: list[str], batch_size: int,
              num_workers: int, chunk_rows: int, progress: bool) -> None:
        done = self._open()
        images = np.load(self.folder / IMAGE_FILE, mmap_mode="r+")
        texts = np.load(self.folder / TEXT_FILE, mmap_mode="r+")
        bar = progress_bar(total=len(self.image_rows) + len(self.text_rows), initial=done["images"] + done["texts"],
                           desc="embed", unit="row", enabled=progress)
        rows = self.image_rows
        for start in range(done["images"], len(rows), chunk_rows):
            stop = min(start + chunk_rows, len(rows))
            embed_images(encoder, dataset, images[start:stop], rows[start:stop], batch_size, num_workers, False)
            self._record(images, done, "images", stop, bar)
        rows = self.text_rows
        for start in range(done["texts"], len(rows), chunk_rows):
            stop = min(start + chunk_rows, len(rows))
            embed_texts(encoder, captions[rows.start + start: rows.start + stop], texts[start:stop],
                        batch_size * 4, False)
            self._record(texts, done, "texts", stop, bar)
        bar.close()

    def _open(self) -> dict:
        """Rows already embedded ({"images": n, "texts": n}); fresh files when there is nothing to carry on."""
        record = _read_progress(self.folder / PROGRESS_FILE, self.key)
        if record is not None and all((self.folder / name).is_file() for name in (IMAGE_FILE, TEXT_FILE)):
            return {"images": int(record["images"]), "texts": int(record["texts"])}
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        for name, rows in ((IMAGE_FILE, self.image_rows), (TEXT_FILE, self.text_rows)):
            table = np.lib.format.open_memmap(self.folder / name, mode="w+", dtype=np.float32,
                                              shape=(len(rows), self.dim))
            table.flush()
            del table
        done = {"images": 0, "texts": 0}
        atomic_write_json(self.folder / PROGRESS_FILE, {"key": self.key, **done})
        return done

    def _record(self, table: np.memmap, done: dict, kind: str, rows: int, bar) -> None:
        """Flush `table` to disk, then record that its first `rows` rows are embedded."""
        table.flush()
        bar.update(rows - done[kind])
        done[kind] = rows
        atomic_write_json(self.folder / PROGRESS_FILE, {"key": self.key, **done})


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
