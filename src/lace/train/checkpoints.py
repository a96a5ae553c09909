"""Checkpoints of a run: complete or absent, never half written.

A checkpoint of step N is three files in `<run>/checkpoints/`:
- `step_000000N.safetensors`: the encoder's weights (`DualEncoder.state_dict()`);
- `step_000000N.state.pt`: optimiser, data position, RNG states and counters, a plain
  dict of tensors and numbers, read with `torch.load(weights_only=True)`;
- `step_000000N.json`: the manifest (step, file names, sizes, SHA-256), written last.
Each is written atomically; a checkpoint counts only once its manifest exists, and the
`latest` pointer file is replaced (atomically) only after that. A process killed at any
moment therefore leaves `latest` on the previous complete checkpoint. Loading checks the
hashes, so a damaged file gives a clear error instead of a silent bad resume.
"""

from __future__ import annotations

import io
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lace.encoders.weights import CHECKPOINT_DIR, LATEST, NAME, latest_checkpoint
from lace.errors import LaceInputError
from lace.io import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from lace.manifest import sha256_file


@dataclass
class Checkpoint:
    """A loaded checkpoint: encoder weights, trainer state and where it came from."""

    path: Path  # the manifest
    step: int
    weights: dict[str, torch.Tensor]
    state: dict


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


def save_checkpoint(run_dir: Path, step: int, weights: dict[str, torch.Tensor], state: dict,
                    keep: int = 0) -> Path:
    """Write checkpoint `step`, point `latest` at it, then keep only the `keep` newest up to `step`
    (0: keep all); checkpoints of later steps are left alone."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    weights_path, state_path = folder / f"{name}.safetensors", folder / f"{name}.state.pt"
    with atomic_path(weights_path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(state_path, buffer.getvalue())
    manifest = {
        "step": step,
        "files": {
            kind: {"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
            for kind, path in (("weights", weights_path), ("state", state_path))
        },
    }
    manifest_path = folder / f"{name}.json"
    atomic_write_json(manifest_path, manifest)
    atomic_write_text(folder / LATEST, name + "\n")
    if keep > 0:
        # Only checkpoints up to this one count: after resuming from an earlier step, later
        # ones (of the abandoned run) must not push the one just written out of the window.
        up_to_now = [m for m in complete_checkpoints(run_dir) if int(NAME.match(m.stem).group(1)) <= step]
        for old in up_to_now[:-keep]:
            for suffix in (".json", ".safetensors", ".state.pt"):  # manifest first: never a manifest without files
                (folder / f"{old.stem}{suffix}").unlink(missing_ok=True)
    return manifest_path


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Manifests of the run's checkpoints, oldest first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    manifests = [p for p in folder.glob("step_*.json") if NAME.match(p.stem)] if folder.is_dir() else []
    return sorted(manifests, key=lambda p: int(NAME.match(p.stem).group(1)))


def resolve_checkpoint(run_dir: Path, resume: str) -> Path:
    """'latest', a manifest / weights / state path, or a `step_XXXXXXX` name -> its manifest."""
    if resume == "latest":
        manifest = latest_checkpoint(run_dir)
        if manifest is None:
            raise LaceInputError(f"{Path(run_dir) / CHECKPOINT_DIR}: no checkpoint to resume from (--resume latest)")
        return manifest
    path = Path(resume)
    if not path.suffix and not path.exists():
        path = Path(run_dir) / CHECKPOINT_DIR / path.name
    stem = path.name.split(".")[0]
    return path.parent / f"{stem}.json"


# What a run folder holds before its first checkpoint: `--resume auto` may start such a folder afresh.
RUN_FILES = ("config.json", "metrics.jsonl", CHECKPOINT_DIR, "tensorboard")


def resume_point(run_dir: Path, resume: str | None) -> Path | None:
    """The manifest a run resumes from: None for a fresh start (`resume` None, or 'auto' in a run with no
    whole checkpoint yet), else what `resolve_checkpoint` finds."""
    if resume is None:
        return None
    run_dir = Path(run_dir)
    if resume == "auto":
        return latest_checkpoint(run_dir) if (run_dir / CHECKPOINT_DIR / LATEST).is_file() else None
    if not run_dir.is_dir():
        raise LaceInputError(f"{run_dir}: run folder not found (--resume needs the folder of the run)")
    return resolve_checkpoint(run_dir, resume)


def clear_unstarted_run(run_dir: Path) -> None:
    """Empty a run folder that holds only what a run writes before its first whole checkpoint (its config,
    metrics, partial checkpoint files), so that `--resume auto` starts it again; other folders are left for
    `prepare_output_dir` to refuse."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or any(p.name not in RUN_FILES for p in run_dir.iterdir()):
        return
    if latest_checkpoint(run_dir) is not None:
        raise LaceInputError(f"{run_dir}: refusing to start afresh over a run with a checkpoint")
    for path in run_dir.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def load_checkpoint(manifest_path: Path, run_dir: Path | None = None) -> Checkpoint:
    """Read and verify a checkpoint; `LaceInputError` naming the file when it is damaged."""
    manifest_path = Path(manifest_path)
    if not manifest_path.is_file():
        raise LaceInputError(f"{manifest_path}: checkpoint manifest not found (an incomplete checkpoint has none)")
    manifest = read_json(manifest_path, dict)
    try:
        files = {kind: manifest_path.parent / manifest["files"][kind]["name"] for kind in ("weights", "state")}
        step = int(manifest["step"])
    except (KeyError, TypeError, ValueError) as error:
        raise LaceInputError(f"{manifest_path}: not a checkpoint manifest (missing {error})") from error
    for kind, path in files.items():
        expected = manifest["files"][kind]["sha256"]
        if not path.is_file() or sha256_file(path) != expected:
            raise _damaged(path, manifest_path, run_dir, "its SHA-256 does not match the manifest"
                           if path.is_file() else "the file is missing")
    try:
        weights = load_file(str(files["weights"]))
    except (SafetensorError, RuntimeError, OSError) as error:
        raise _damaged(files["weights"], manifest_path, run_dir, str(error)) from error
    try:
        state = torch.load(files["state"], map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses anything but tensors and plain values
        raise LaceInputError(f"{files['state']}: refused: the trainer state holds objects other than tensors and "
                             "plain values, which could run code when unpickled; only load checkpoints you trust "
                             f"from a source that wrote them with lace ({error})") from error
    except (RuntimeError, OSError, EOFError) as error:
        raise _damaged(files["state"], manifest_path, run_dir, str(error)) from error
    if not isinstance(state, dict):
        raise _damaged(files["state"], manifest_path, run_dir, f"expected a dict, got {type(state).__name__}")
    return Checkpoint(manifest_path, step, weights, state)


def _damaged(path: Path, manifest_path: Path, run_dir: Path | None, why: str) -> LaceInputError:
    others = [m for m in complete_checkpoints(run_dir or manifest_path.parent.parent) if m != manifest_path]
    earlier = [m for m in others if m.stem < manifest_path.stem]
    hint = (f"; the previous checkpoint {earlier[-1]} is kept: resume from it with --resume {earlier[-1]}"
            if earlier else "; no earlier checkpoint exists")
    return LaceInputError(f"{path}: checkpoint is damaged ({why}){hint}")
