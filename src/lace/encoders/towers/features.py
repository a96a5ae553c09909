"""Tower features computed once, batched, and cached on disk as memory-mappable `.npy`.

With the towers locked, training and evaluation of the heads only need the tower
features of each image and caption. They are cached under `cache_dir` as
`image-tower-<key>.npy` (N_img, 1280) and `text-tower-<key>.npy` (N_txt, 384),
float32, each with a `.json` beside it describing what it holds. The key is a hash
of the tower id, a fingerprint of the tower weights (so a fine-tuned tower never
reads a stale cache) and the ordered image paths or captions.

Speed (measured, see `benchmarks/towers_features.py` and docs/results.md): JPEGs are
decoded in DataLoader workers, Pillow's `draft` mode decodes large JPEGs at a reduced
scale (never below the resize size; `draft=False` decodes at full size, under its own
cache key), captions are encoded in batches sorted by length so that little padding is
computed, and each tower runs in ONNX Runtime (`runtime="onnxruntime"`,
`lace.encoders.towers.onnx_runtime`) or in PyTorch (`runtime="torch"`: channels_last,
`torch.inference_mode`), the text tower also in PyTorch under bfloat16 autocast
(`runtime="torch-bf16"`, in bfloat16 hardware where the CPU has it: AMX or AVX-512 BF16). By
default the image tower runs in ONNX Runtime where it is installed and the text tower in
bfloat16 where the CPU has such hardware, else in float32 (`onnx_runtime.default_runtime` says why). Every runtime gives the same
features within cosine 1 - 1e-4, so the cache key does not name the runtime, as it does not
name the thread count. The runtimes use `torch.get_num_threads()` intra-op threads; the
library leaves the thread count alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from lace.data.dataset import ImageRows, ImageTextDataset
from lace.encoders.towers import image_tower, onnx_runtime, text_tower
from lace.encoders.towers.model import TowersDualEncoder
from lace.errors import LaceInputError
from lace.io import atomic_path, atomic_write_json, open_npy
from lace.manifest import entry_manifest, verify, write_manifest
from lace.progress import bar as progress_bar


def tower_fingerprint(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> str:
    """Short hash of a module's parameters and buffers (changes whenever its weights do), but for those whose
    names start with one of `skip`."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        if name.startswith(skip):
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def cache_key(tower_id: str, fingerprint: str, items: list[str]) -> str:
    digest = hashlib.sha256(json.dumps([tower_id, fingerprint, items]).encode())
    return digest.hexdigest()[:24]


def _save_array(path: Path, array: np.ndarray, description: dict) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array, dtype=np.float32))
    atomic_write_json(path.with_suffix(".json"), description)
    write_manifest(path.parent, (path.name, path.with_suffix(".json").name), name=entry_manifest(path).name)


def _cached(path: Path, rows: int, dim: int, compute, description: dict) -> np.ndarray:
    """The (rows, dim) array cached at `path`, else `compute()` written there with `description` beside it;
    a read-only memory map either way."""
    if path.is_file():
        verify(path.parent, (path.name, path.with_suffix(".json").name), manifest=entry_manifest(path))
        array = open_npy(path, "cached tower features (delete the file to recompute it)")
        if array.shape != (rows, dim):
            raise LaceInputError(f"{path}: cached tower features of shape {array.shape}, expected {(rows, dim)}")
        return array
    _save_array(path, compute(), description)
    return np.load(path, mmap_mode="r")


FULL_DECODE_KEY = ":full-decode"
"""Added to the image tower id in the cache key of features decoded without draft mode."""


def _runtime(runtime: str | None, tower: str) -> str:
    """`runtime`, or `tower`'s default one when None."""
    runtime = onnx_runtime.default_runtime(tower) if runtime is None else runtime
    if runtime not in onnx_runtime.RUNTIMES[tower]:
        raise LaceInputError(f"{tower} tower runtime: expected one of {onnx_runtime.RUNTIMES[tower]}, got {runtime!r}")
    return runtime


_sessions: dict[str, tuple[tuple[str, int], onnx_runtime.TowerSession]] = {}
"""The last ONNX Runtime session of each tower kind, with the (weight fingerprint, threads) it was made for."""


def _session(kind: str, tower: torch.nn.Module) -> onnx_runtime.TowerSession:
    """The ONNX Runtime session of `tower`'s current weights, exported on first use."""
    wanted = (tower_fingerprint(tower), torch.get_num_threads())
    made, session = _sessions.get(kind, (None, None))
    if made != wanted:
        build = onnx_runtime.image_session if kind == "image" else onnx_runtime.text_session
        session = build(tower, wanted[1])
        _sessions[kind] = (wanted, session)
    return session


def compute_image_tower_features(
    encoder: TowersDualEncoder,
    dataset: ImageTextDataset,
    batch_size: int = 64,
    num_workers: int = 1,
    progress: bool = False,
    runtime: str | None = None,
    draft: bool = True,
) -> np.ndarray:
    """(N_img, 1280) float32 image tower features of every record, in record order.

    `runtime`: "onnxruntime" or "torch" (same features; None: the default); `draft`: decode large JPEGs at a
    reduced scale (features differ slightly from a full decode; see the module docstring).
    """
    runtime = _runtime(runtime, "image")
    loader = torch.utils.data.DataLoader(
        ImageRows(dataset, encoder.preprocess, draft=image_tower.RESIZE_SIZE if draft else None),
        batch_size=batch_size, num_workers=num_workers, shuffle=False,
    )
    session = _session("image", encoder.image_tower) if runtime == "onnxruntime" and len(dataset) else None
    output = np.empty((len(dataset), image_tower.FEATURE_DIM), dtype=np.float32)
    start = 0
    with torch.inference_mode():
        for pixels in progress_bar(loader, desc="image tower", unit="batch", enabled=progress):
            if session is not None:
                features = session(pixels.numpy())  # (B, 1280)
            else:
                features = encoder.image_tower_features(pixels).float().cpu().numpy()
            output[start:start + len(features)] = features
            start += len(features)
    return output


def compute_text_tower_features(
    encoder: TowersDualEncoder, captions: list[str], batch_size: int = 256, progress: bool = False,
    runtime: str | None = None,
) -> np.ndarray:
    """(N_txt, 384) float32 text tower features of `captions`, in their order.

    `runtime`: "onnxruntime", "torch" or "torch-bf16" (bfloat16 autocast; same features within 1e-4 cosine);
    None: the default (`onnx_runtime.default_runtime`).
    """
    runtime = _runtime(runtime, "text")
    session = _session("text", encoder.text_tower) if runtime == "onnxruntime" and captions else None
    output = np.empty((len(captions), text_tower.FEATURE_DIM), dtype=np.float32)
    # batches of captions with equal token counts pad little: 35% faster than sorting by characters
    by_length = np.argsort(encoder.text_tower.token_counts(captions), kind="stable") if captions else []
    bf16 = torch.autocast(encoder.device.type, dtype=torch.bfloat16, enabled=runtime == "torch-bf16")
    with torch.inference_mode(), bf16:
        for start in progress_bar(range(0, len(captions), batch_size), desc="text tower", unit="batch",
                                  enabled=progress):
            rows = by_length[start:start + batch_size]
            tokens = encoder.tokenize([captions[i] for i in rows])
            if session is not None:
                output[rows] = session(*onnx_runtime.text_inputs(tokens, encoder.text_tower.pad_token_id))
            else:
                output[rows] = encoder.text_tower_features(tokens).float().cpu().numpy()
    return output


def cached_image_tower_features(
    encoder: TowersDualEncoder,
    dataset: ImageTextDataset,
    cache_dir: str | Path,
    batch_size: int = 64,
    num_workers: int = 1,
    progress: bool = False,
    runtime: str | None = None,
    draft: bool = True,
) -> np.ndarray:
    """Image tower features of `dataset`, read from `cache_dir` when present, else computed and cached.

    Returns a read-only (N_img, 1280) float32 memory map.
    """
    items = [f"{record.image_path}::{record.tar_member or ''}" for record in dataset.records]
    tower_id = encoder.image_tower.tower_id + ("" if draft else FULL_DECODE_KEY)
    key = cache_key(tower_id, tower_fingerprint(encoder.image_tower), items)
    path = Path(cache_dir) / f"image-tower-{key}.npy"
    return _cached(path, len(items), image_tower.FEATURE_DIM, lambda: compute_image_tower_features(
        encoder, dataset, batch_size, num_workers, progress, runtime, draft), {
        "tower": tower_id, "rows": len(items), "dim": image_tower.FEATURE_DIM,
        "source": dataset.source, "first_item": items[0] if items else None,
    })


def cached_text_tower_features(
    encoder: TowersDualEncoder,
    captions: list[str],
    cache_dir: str | Path,
    batch_size: int = 256,
    progress: bool = False,
    runtime: str | None = None,
) -> np.ndarray:
    """Text tower features of `captions`, read from `cache_dir` when present, else computed and cached.

    Returns a read-only (N_txt, 384) float32 memory map.
    """
    captions = list(captions)
    tower_id = f"{encoder.text_tower.tower_id}:max-tokens-{encoder.text_tower.max_tokens}"
    key = cache_key(tower_id, tower_fingerprint(encoder.text_tower), captions)
    path = Path(cache_dir) / f"text-tower-{key}.npy"
    return _cached(path, len(captions), text_tower.FEATURE_DIM, lambda: compute_text_tower_features(
        encoder, captions, batch_size, progress, runtime), {
        "tower": tower_id, "rows": len(captions), "dim": text_tower.FEATURE_DIM,
        "first_item": captions[0] if captions else None})

