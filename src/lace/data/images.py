"""The one policy for image files that are missing or cannot be read, for every command that reads images.

`check_images` looks at each distinct file once (it exists; Pillow decodes it: JPEGs at reduced scale, which still
reads all of their data, so a truncated file is found); `usable_items` keeps the items whose images are all usable
under a policy, "skip" (leave them out, counted) or "error" (stop, naming them); `apply_image_policy` does so for
an `ImageTextDataset`. Counts are of image files, not of rows or captions, and the first few are named.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lace.errors import LaceInputError

if TYPE_CHECKING:
    from lace.data.dataset import ImageTextDataset

MISSING_IMAGE_POLICIES = ("skip", "error")
NAMED_FILES = 3
"""How many bad files a message names."""
DRAFT_SIZE = (1, 1)
"""Asked of a JPEG's decoder: it decodes at its smallest scale (1/8), which still reads every byte."""
CHECK_THREADS = 8
"""Files decoded side by side (Pillow's decoders release the GIL)."""
_decoded: dict[str, tuple[int, int]] = {}
"""Files this process decoded whole, with the (size, mtime) they had: a second look (the demo evaluates many
models on one world) reads only their stat."""


def image_problem(path: str | Path) -> str | None:
    """None when `path` is an image file Pillow can decode; else why not ("missing" or the decoder's words)."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        return "missing"
    stat = path.stat()
    if _decoded.get(str(path)) == (stat.st_size, stat.st_mtime_ns):
        return None
    try:
        with Image.open(path) as image:
            image.draft("RGB", DRAFT_SIZE)
            image.load()
    except UnidentifiedImageError:
        return "not an image file Pillow can read"
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return str(error).strip() or type(error).__name__
    _decoded[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return None


@dataclass
class ImageCheck:
    """What a look at the image files of `source` found: its distinct `files`, the `missing` ones and the
    `unreadable` ones (path -> why)."""

    source: str
    files: list[str] = field(default_factory=list, repr=False)
    missing: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def n_files(self) -> int:
        return len(self.files)

    @property
    def bad(self) -> list[str]:
        return self.missing + list(self.unreadable)

    def _details(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing: " + _named(self.missing))
        if self.unreadable:
            parts.append(f"{len(self.unreadable)} unreadable: " + _named(
                [f"{path} ({why})" for path, why in self.unreadable.items()]))
        return "; ".join(parts)

    def summary(self) -> str:
        """One line: how many files were left out, of how many, and the first few of them."""
        return f"{self.source}: skipped {len(self.bad)} of {self.n_files} image files ({self._details()})"

    def error(self, hint: str | None = None, folder_flag: str = "--image-root") -> LaceInputError:
        """The error for policy "error", or for nothing usable; when none exist, where they were looked for and
        the flag that names the folder they are relative to."""
        if self.n_files and len(self.missing) == self.n_files:
            folder = os.path.commonpath([str(Path(p).parent) for p in self.missing[:100]]) if self.missing else ""
            message = (f"{self.source}: none of the {self.n_files} image files exist (e.g. {self.missing[0]}); "
                       f"they were looked for under {folder}: if the paths are relative to another folder, "
                       f"pass it as {folder_flag}")
        elif len(self.bad) == self.n_files:
            message = f"{self.source}: none of the {self.n_files} image files can be used ({self._details()})"
        else:
            message = (f"{self.source}: {len(self.bad)} of {self.n_files} image files cannot be used "
                       f"({self._details()}); fix them, or pass --missing-images skip to leave them out")
        return LaceInputError(message + (f"; {hint}" if hint else ""))


def _named(items: Sequence[str]) -> str:
    shown = ", ".join(items[:NAMED_FILES])
    return shown + (f", ... ({len(items) - NAMED_FILES} more)" if len(items) > NAMED_FILES else "")


def check_images(paths: Iterable[str | Path], source: str, readable: bool = True) -> ImageCheck:
    """Look at each distinct file of `paths` once; `readable`: also decode it (else only check it exists)."""
    files = list(dict.fromkeys(str(p) for p in paths))
    check = ImageCheck(source, files)
    if readable:
        with ThreadPoolExecutor(max_workers=max(1, min(CHECK_THREADS, os.cpu_count() or 1))) as pool:
            problems = list(pool.map(image_problem, files, chunksize=64))
    else:
        problems = [None if Path(path).is_file() else "missing" for path in files]
    for path, problem in zip(files, problems):
        if problem == "missing":
            check.missing.append(path)
        elif problem is not None:
            check.unreadable[path] = problem
    return check


def merge_checks(checks: Sequence[ImageCheck], source: str) -> ImageCheck:
    """One check over the distinct files of several (the parts of a benchmark share images)."""
    merged = ImageCheck(source, list(dict.fromkeys(path for check in checks for path in check.files)))
    merged.missing = list(dict.fromkeys(path for check in checks for path in check.missing))
    for check in checks:
        merged.unreadable.update(check.unreadable)
    return merged


def validate_policy(policy: str, where: str = "--missing-images") -> str:
    if policy not in MISSING_IMAGE_POLICIES:
        raise LaceInputError(f"{where}: expected one of {MISSING_IMAGE_POLICIES} (got {policy!r})")
    return policy


def usable_items(item_images: Sequence[Sequence[str | Path]], policy: str, source: str,
                 hint: str | None = None, readable: bool = True, require_some: bool = True,
                 folder_flag: str = "--image-root") -> tuple[list[int], ImageCheck]:
    """Indices of the items (each a sequence of its image paths) whose images are all usable, and the check.

    policy "error": any bad file is a `LaceInputError` naming it; "skip": the items with a bad file are left
    out, and an error when no item is left (unless not `require_some`: the caller counts what is left over
    several sets). `hint` ends those errors (where the images are published); `folder_flag` names what sets the
    folder the paths are relative to.
    """
    validate_policy(policy)
    check = check_images((path for paths in item_images for path in paths), source, readable)
    if not check.bad:
        return list(range(len(item_images))), check
    if policy == "error":
        raise check.error(hint, folder_flag)
    bad = set(check.bad)
    keep = [i for i, paths in enumerate(item_images) if not any(str(path) in bad for path in paths)]
    if not keep and require_some:
        raise check.error(hint, folder_flag)
    return keep, check


def apply_image_policy(dataset: ImageTextDataset, policy: str, readable: bool = True,
                       hint: str | None = None) -> tuple[ImageTextDataset, ImageCheck]:
    """`dataset` without the records whose image is missing or unreadable (policy "skip"), or an error naming
    them (policy "error"). Images inside tar shards are read as training meets them, not here."""
    on_disk = [i for i, record in enumerate(dataset.records) if record.tar_member is None]
    keep, check = usable_items([[dataset.records[i].image_path] for i in on_disk], policy, dataset.source,
                               hint=hint, readable=readable)
    if len(keep) == len(on_disk):
        return dataset, check
    dropped = {on_disk[i] for i in set(range(len(on_disk))) - set(keep)}
    return dataset.subset([i for i in range(len(dataset)) if i not in dropped]), check
