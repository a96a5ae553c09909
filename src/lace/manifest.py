"""SHA-256 manifests of the folders lace writes, written last and checked on load.

A manifest is a JSON file (`manifest.json` in the folder, or `<entry>.manifest.json` beside one entry of
a cache that several processes fill) listing files relative to its folder with their size and SHA-256:

    {"format": "lace-manifest/1", "files": {"dictionary.safetensors": {"bytes": 1234, "sha256": "..."}}}

Writers call `add_to_manifest` (or `write_manifest`) after their files are in place, so a manifest never
lists a file that is not whole. Readers call `verify` for the files they read: a file whose SHA-256 differs
is a `LaceInputError` naming it. A folder written before manifests existed loads with a warning.
`verification(False)` (the command line's `--no-verify`) skips the hashing, for stores too large to hash on
each load (SHA-256 reads about 3 s per GiB from the page cache on one core of this project's 2-core
reference machine, see docs/robustness.md). A file hashed once is not hashed
again while its size, modification time and inode stay the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lace.errors import LaceInputError
from lace.io import atomic_write_json

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "lace-manifest/1"
_state = {"verify": True}
_hashed: dict[tuple, str] = {}  # (path, size, mtime_ns, inode) -> SHA-256 of a file read in this process
_warned: set[str] = set()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entry(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _is_manifest(path: Path) -> bool:
    return path.name == MANIFEST or path.name.endswith(".manifest.json")


def write_manifest(folder: str | os.PathLike, files: Iterable[str | os.PathLike] | None = None,
                   name: str = MANIFEST) -> Path:
    """Write `folder/name` listing `files` (paths relative to `folder`; default: every file under it that is
    not hidden and not a manifest), atomically; return its path."""
    folder = Path(folder)
    if files is None:
        files = sorted(p.relative_to(folder) for p in folder.rglob("*")
                       if p.is_file() and not _is_manifest(p)
                       and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    listed = {Path(f).as_posix(): _entry(folder / f) for f in files}
    path = folder / name
    atomic_write_json(path, {"format": FORMAT, "files": listed})
    return path


def add_to_manifest(folder: str | os.PathLike, files: Iterable[str | os.PathLike]) -> Path:
    """Add (or update) `files` of `folder` in its `manifest.json`, keeping the entries of other files that
    still exist: for folders that several writers fill one after another (a dictionary's parts)."""
    folder = Path(folder)
    listed = _read(folder / MANIFEST)
    previous = [name for name in (listed or {}) if (folder / name).is_file()]
    wanted = {Path(f).as_posix() for f in files}
    return write_manifest(folder, sorted(set(previous) | wanted))


def entry_manifest(path: str | os.PathLike) -> Path:
    """The manifest of one cache entry `path` (`<stem>.manifest.json` beside it)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.manifest.json")


def _read(path: Path) -> dict | None:
    """The file table of a manifest, None when there is none; a damaged one is a `LaceInputError`."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise LaceInputError(f"{path}: damaged manifest, not valid JSON ({error}); pass --no-verify to read the "
                             "folder unchecked") from error
    if not isinstance(value, dict) or value.get("format") != FORMAT or not isinstance(value.get("files"), dict):
        raise LaceInputError(f"{path}: field 'format': expected a lace manifest ({FORMAT!r} with 'files')")
    return value["files"]


def verify(folder: str | os.PathLike, files: Iterable[str | os.PathLike], manifest: str | os.PathLike | None = None,
           warn_missing: bool = True) -> None:
    """Check `files` (relative to `folder`) against the folder's manifest (or `manifest`, a path).

    Raises `LaceInputError` naming the first file whose size or SHA-256 differs. A folder without a manifest
    (written before lace wrote them) or a file the manifest does not list is read with a warning, once per
    folder, when `warn_missing`. Does nothing under `verification(False)`.
    """
    if not _state["verify"]:
        return
    folder = Path(folder)
    manifest_path = Path(manifest) if manifest is not None else folder / MANIFEST
    listed = _read(manifest_path)
    for name in files:
        name = Path(name).as_posix()
        path = folder / name
        if listed is None or name not in listed:
            if warn_missing and str(manifest_path) not in _warned and path.is_file():
                _warned.add(str(manifest_path))
                what = "has no manifest" if listed is None else f"lists no {name}"
                logger.warning("%s %s (written by an older lace?): its files are read without a SHA-256 check",
                               manifest_path if listed is not None else folder, what)
            continue
        if not path.is_file():
            continue  # the reader says what is missing
        _check(path, listed[name], manifest_path)


def verify_nearby(path: str | os.PathLike, levels: int = 2) -> None:
    """Check one file against the manifest of its folder or of a folder up to `levels` above, if one lists it
    (generic readers, such as a dataset reader given a file of a world folder); silent when none does, and
    when the nearest `manifest.json` is not lace's (a dataset may ship a file of that name)."""
    if not _state["verify"]:
        return
    path = Path(path)
    for folder in list(path.parents)[: levels + 1]:
        candidate = folder / MANIFEST
        if candidate.is_file():
            try:
                listed = _read(candidate)
            except LaceInputError:
                return
            name = path.relative_to(folder).as_posix()
            if name in listed and path.is_file():
                _check(path, listed[name], candidate)
            return


def _check(path: Path, expected: dict, manifest_path: Path) -> None:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    try:
        size, sha = int(expected["bytes"]), str(expected["sha256"])
    except (KeyError, TypeError, ValueError) as error:
        raise LaceInputError(f"{manifest_path}: entry of {path.name}: expected 'bytes' and 'sha256'") from error
    if stat.st_size != size:
        raise LaceInputError(f"{path}: damaged: {stat.st_size} bytes, {manifest_path.name} says {size}; "
                             "write it again (or pass --no-verify to read it as it is)")
    actual = _hashed.get(key) or sha256_file(path)
    if actual != sha:
        raise LaceInputError(f"{path}: damaged: its SHA-256 does not match {manifest_path.name}; write it again "
                             "(or pass --no-verify to read it as it is)")
    _hashed[key] = actual


def verification_enabled() -> bool:
    return _state["verify"]


@contextmanager
def verification(enabled: bool) -> Iterator[None]:
    """Within the block, check manifests on load or not; restored afterwards."""
    before = _state["verify"]
    _state["verify"] = bool(enabled)
    try:
        yield
    finally:
        _state["verify"] = before
