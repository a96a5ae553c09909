"""What `--pretrained` names, decided from the file itself.

Every command that takes a model passes its `--pretrained` through `resolve_pretrained`; `load_encoder`
then builds the model from what it found:
- a run folder of `lace train` (`RUN/checkpoints/latest` names its latest whole checkpoint);
- a training checkpoint, `RUN/checkpoints/step_*.safetensors` (or its manifest `step_*.json`): the
  `DualEncoder`'s own state dict, whose keys carry the adapter's prefix (`model.` for open_clip);
- an export of `lace export`, or any state dict of the architecture (`.pt`, `.bin`, `.safetensors`);
- a Hugging Face model folder (`config.json` with a `model_type`) or an open_clip model folder
  (`open_clip_config.json` and its weights);
- an open_clip pretrained tag (`openai`, `laion2b_s34b_b79k`, ...), or none / "none" for random init.
Anything else is one `LaceInputError` line naming what was found. Nothing here unpickles: files are told
apart by their first bytes, safetensors headers and side JSONs; the loaders read them safely
(safetensors, `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from lace.errors import LaceInputError
from lace.io import read_json

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
NAME = re.compile(r"^step_(\d{7,})$")
RUN_CONFIG = "config.json"
OPEN_CLIP_FOLDER_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
TRAINED = ("run", "training checkpoint")
"""Kinds holding a `DualEncoder.state_dict()`: loaded into the built model, not handed to open_clip."""
EXPECTED = ("a lace run folder, a training checkpoint (RUN/checkpoints/step_*.safetensors), an export or state dict "
            "(.pt, .bin, .safetensors), a Hugging Face or open_clip model folder, an open_clip pretrained tag, "
            "or none")


@dataclass(frozen=True)
class Weights:
    """What a `--pretrained` value names.

    kind: "none", "tag", "run", "training checkpoint", "export", "state dict", "hf folder".
    path: the file to read (for a run: its latest checkpoint's weights; for a Hugging Face folder: the folder).
    model: the model name the files record (a run's config.json, an export's side JSON), when they do.
    origin: the weights the run started from (its config.json's `pretrained`), for the activation they need.
    hf_type: a Hugging Face folder's `model_type` (clip, siglip, ...).
    sha256: a training checkpoint's weights hash, as its manifest records it.
    """

    kind: str
    given: str | None
    path: Path | None = None
    model: str | None = None
    origin: str | None = None
    hf_type: str | None = None
    sha256: str | None = None

    @property
    def open_clip_value(self) -> str | None:
        """What open_clip's `pretrained=` takes for this: the tag, the file, or None."""
        if self.kind == "tag":
            return self.given
        return None if self.path is None else str(self.path)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Manifest named by the run's `latest` pointer (None when the run has no checkpoint yet)."""
    pointer = Path(run_dir) / CHECKPOINT_DIR / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_bytes().decode("utf-8", errors="replace").strip()
    if not NAME.match(name):
        raise LaceInputError(f"{pointer}: expected a checkpoint name like step_0000100, got {name!r}")
    return pointer.parent / f"{name}.json"


def resolve_pretrained(pretrained: str | None) -> Weights:
    """What `pretrained` names (see the module docstring); `LaceInputError` naming what was found otherwise."""
    if pretrained is None or str(pretrained).lower() == "none":
        return Weights("none", None)
    pretrained = str(pretrained)
    path = Path(pretrained).expanduser()
    if path.is_dir():
        return _folder(path, pretrained)
    if path.is_file():
        return _file(path, pretrained)
    if "/" in pretrained or "\\" in pretrained or path.suffix in (".pt", ".pth", ".bin", ".safetensors", ".json"):
        raise LaceInputError(f"{pretrained}: checkpoint file not found (--pretrained: expected {EXPECTED})")
    return Weights("tag", pretrained)


def _folder(path: Path, given: str) -> Weights:
    manifest = latest_checkpoint(path)
    if manifest is not None:
        return _checkpoint(manifest, given, "run")
    if (path / CHECKPOINT_DIR).is_dir():
        raise LaceInputError(f"{path}: a lace run folder with no whole checkpoint yet ({CHECKPOINT_DIR}/{LATEST} "
                             "is missing): train it further or give a checkpoint file")
    for name in OPEN_CLIP_FOLDER_FILES:
        if (path / "open_clip_config.json").is_file() and (path / name).is_file():
            return Weights("state dict", given, path / name)
    config = read_json(path / "config.json") if (path / "config.json").is_file() else None
    if isinstance(config, dict) and "model_type" in config:
        return Weights("hf folder", given, path, hf_type=str(config["model_type"]))
    found = sorted(p.name for p in path.iterdir())
    listing = ", ".join(found[:6]) + (", ..." if len(found) > 6 else "") if found else "nothing"
    raise LaceInputError(f"{path}: a folder holding {listing}, which is none of what --pretrained takes "
                         f"(expected {EXPECTED})")


def _file(path: Path, given: str) -> Weights:
    stem = path.name.split(".")[0]
    manifest = path.parent / f"{stem}.json"
    if NAME.match(stem) and manifest.is_file():
        if path.name.endswith(".state.pt"):
            raise LaceInputError(f"{path}: a training checkpoint's trainer state (optimiser, data position), not "
                                 f"its weights; give {stem}.safetensors or the run folder")
        return _checkpoint(manifest, given, "training checkpoint")
    with path.open("rb") as f:
        head = f.read(8)
    if _is_safetensors(path, head):
        keys = _safetensors_keys(path)
        if keys and all(key.startswith("model.") for key in keys):
            return Weights("training checkpoint", given, path)
        return _export(path, given)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch.save's zip, or a legacy pickle
        return _export(path, given)
    what = "a JSON file" if path.suffix == ".json" else f"{path.stat().st_size} bytes of neither safetensors nor torch"
    raise LaceInputError(f"{path}: {what}, not model weights (--pretrained: expected {EXPECTED})")


def _checkpoint(manifest: Path, given: str, kind: str) -> Weights:
    """A training checkpoint by its manifest, with the model and starting weights of its run when recorded."""
    record = read_json(manifest, dict)
    try:
        weights = manifest.parent / record["files"]["weights"]["name"]
        sha256 = str(record["files"]["weights"]["sha256"])
    except (KeyError, TypeError) as error:
        raise LaceInputError(f"{manifest}: not a checkpoint manifest (missing {error})") from error
    if not weights.is_file():
        raise LaceInputError(f"{weights}: checkpoint weights missing (named by {manifest})")
    config_path = manifest.parent.parent / RUN_CONFIG
    config = read_json(config_path) if manifest.parent.name == CHECKPOINT_DIR and config_path.is_file() else {}
    config = config if isinstance(config, dict) else {}
    return Weights(kind, given, weights, model=config.get("model"), origin=config.get("pretrained"),
                   sha256=sha256)


def _export(path: Path, given: str) -> Weights:
    side = path.with_name(path.name + ".json")
    record = read_json(side) if side.is_file() else None
    if isinstance(record, dict) and isinstance(record.get("model"), str):
        return Weights("export", given, path, model=record["model"])
    return Weights("state dict", given, path)


def _is_safetensors(path: Path, head: bytes) -> bool:
    """Whether the file starts as safetensors does: an 8-byte header length, then a JSON object."""
    if len(head) < 8:
        return False
    size = struct.unpack("<Q", head)[0]
    if not 2 <= size <= path.stat().st_size - 8:
        return False
    with path.open("rb") as f:
        f.seek(8)
        return f.read(1) == b"{"


def _safetensors_keys(path: Path) -> list[str]:
    with path.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        try:
            header = json.loads(f.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise LaceInputError(f"{path}: damaged safetensors header ({error})") from error
    return [key for key in header if key != "__metadata__"]
