"""Atomic writes and output folders that never clobber what a user already had."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from lace.errors import LaceInputError

if TYPE_CHECKING:
    import numpy as np


def current_umask() -> int:
    """The process's file-mode creation mask, read without changing it (Linux's /proc; elsewhere set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it over `path` atomically.

    A process killed mid-write leaves the old file (or nothing), never half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        # mkstemp (and writers that replace the file, such as safetensors) make owner-only files: give it the
        # mode open() would, so that others read what lace writes as the umask allows
        os.chmod(tmp_path, 0o666 & ~current_umask())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden temporary folder beside `path`; on success it replaces `path` in one rename.

    A process killed while filling it leaves `path` as it was (a folder that looks complete is
    always complete); the next run clears the leftover temporary folder.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(tmp: Path, path: Path) -> None:
    """Move folder `tmp` to `path`, replacing what is there (moved aside first, removed after)."""
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: object) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_text(path: str | os.PathLike) -> str:
    """Read a UTF-8 text file, turning a missing file or other bytes into a `LaceInputError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise LaceInputError(f"{path}: file not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise LaceInputError(f"{path}: not UTF-8 text ({error})") from error


JSON_KINDS = {dict: "a JSON object", list: "a JSON list"}


def read_json(path: str | os.PathLike, expected: type | None = None, what: str | None = None) -> object:
    """Read JSON, turning a missing, damaged or malformed file into a `LaceInputError` naming it.

    expected: `dict` or `list` to refuse JSON of another shape (a damaged file that still parses); `what`
    says what the file should hold in that error (default: a JSON object, a JSON list).
    """
    path = Path(path)
    text = read_text(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise LaceInputError(f"{path}: not valid JSON ({error})") from error
    except RecursionError as error:  # nesting deeper than the interpreter's stack
        raise LaceInputError(f"{path}: not valid JSON (nested too deeply)") from error
    if expected is not None and not isinstance(value, expected):
        raise LaceInputError(f"{path}: expected {what or JSON_KINDS.get(expected, expected.__name__)}, "
                             f"got {type(value).__name__}")
    return value


def read_safetensors(path: str | os.PathLike) -> dict:
    """Read a safetensors file as {name: tensor} (CPU); a missing or damaged file is a `LaceInputError` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise LaceInputError(f"{path}: file not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise LaceInputError(f"{path}: damaged or not a safetensors file ({error})") from error


def open_npy(path: str | os.PathLike, what: str = "array") -> np.ndarray:
    """Memory-map a `.npy` file read-only; a missing, truncated or damaged one is a `LaceInputError` naming it."""
    import numpy as np  # here, so that `lace --help` (which writes through this module) imports no numpy

    path = Path(path)
    if not path.is_file():
        raise LaceInputError(f"{path}: file not found")
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, EOFError, OSError) as error:  # numpy's errors for a damaged header or short data
        raise LaceInputError(f"{path}: unreadable {what}, damaged or cut short ({error})") from error


def prepare_output_dir(
    path: str | os.PathLike, overwrite: bool = False, inputs: tuple[str | os.PathLike, ...] = ()
) -> Path:
    """Create `path` as an output folder; refuse a non-empty one unless `overwrite`.

    With `overwrite` the old contents are removed only when the folder exists, and never
    when one of `inputs` (the files or folders the command reads) lies inside it.
    """
    path = Path(path)
    for source in inputs:
        if Path(source).resolve().is_relative_to(path.resolve()):
            raise LaceInputError(f"{path}: the output folder holds the input {source}; choose another output folder")
    if path.exists() and not path.is_dir():
        raise LaceInputError(f"{path}: expected an output folder, found a file")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise LaceInputError(
                f"{path}: output folder is not empty; pass --overwrite to replace it"
            )
        _refuse_to_clear(path)
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_output_file(
    path: str | os.PathLike, overwrite: bool = False, what: str = "output file",
    inputs: Iterable[str | os.PathLike] = (),
) -> Path:
    """Check `path` as a file a command is about to write: refuse an existing one unless `overwrite`, a folder,
    and, even with `overwrite`, one of `inputs` (the files the command reads).

    `what` names the file in the error (e.g. "--png file"). Nothing is written: the caller writes atomically.
    """
    path = Path(path)
    for source in inputs:
        if Path(source).resolve() == path.resolve():
            raise LaceInputError(f"{path}: the {what} is the input {source}; choose another output file")
    if path.is_dir():
        raise LaceInputError(f"{path}: expected a path for the {what}, found a folder")
    if path.exists() and not overwrite:
        raise LaceInputError(f"{path}: {what} exists; pass --overwrite to replace it")
    return path


def _refuse_to_clear(path: Path) -> None:
    """Refuse to empty the working folder, one above it, the home folder or a filesystem root:
    a mistyped output path with --overwrite would otherwise delete far more than a run."""
    resolved = path.resolve()
    protected = {Path.home().resolve(), Path(resolved.anchor)}
    if resolved in protected or Path.cwd().resolve().is_relative_to(resolved):
        raise LaceInputError(
            f"{path}: refusing to overwrite this folder (it is the working folder, holds it, or is the home "
            "or root folder); give a dedicated output folder"
        )


@contextmanager
def removed_on_failure(*paths: str | os.PathLike | None) -> Iterator[None]:
    """Remove the folders a command creates for `paths` (an output folder, or a file's folder) when its body fails
    on bad input (`LaceInputError`): only folders that did not exist on entry, the highest of them for each path.
    An interrupt keeps them: a run resumes from what it wrote."""
    created = []
    for path in paths:
        if path is None:
            continue
        path = Path(path).absolute()
        if path.exists():
            continue
        while not path.parent.exists():
            path = path.parent
        created.append(path)
    try:
        yield
    except LaceInputError:
        for path in created:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
        raise
