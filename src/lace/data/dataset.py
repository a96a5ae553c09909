"""The one image-text dataset abstraction every reader returns."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from lace.errors import LaceInputError


def open_rgb(path: str | Path, context: str = "", draft: int | None = None) -> Image.Image:
    """The image file at `path` as RGB; a missing one (`context` said after its path) or an unreadable one is a
    `LaceInputError` naming it. `draft`: let a JPEG decode at its smallest 1/2^k scale still >= this size on
    both sides (Pillow's draft mode; other formats ignore it)."""
    if not Path(path).is_file():
        raise LaceInputError(f"{path}: image file not found{context}")
    try:
        with Image.open(path) as image:
            if draft is not None:
                image.draft("RGB", (draft, draft))
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise LaceInputError(f"{path}: unreadable image ({error})") from error


@dataclass(frozen=True)
class ImageTextRecord:
    """One image and its captions.

    `image_path` is a file on disk, or a tar shard when `tar_member` names the image
    inside it (webdataset).
    """

    image_id: str
    image_path: Path
    captions: tuple[str, ...]
    split: str | None = None
    tar_member: str | None = None


@dataclass
class ImageTextDataset:
    """A list of `ImageTextRecord`s plus where they were read from."""

    records: list[ImageTextRecord]
    source: str
    _tar_handles: dict[Path, tarfile.TarFile] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> ImageTextRecord:
        return self.records[index]

    @property
    def captions(self) -> list[str]:
        """All captions, image by image, in record order."""
        return [caption for record in self.records for caption in record.captions]

    @property
    def caption_image_index(self) -> list[int]:
        """For each caption in `captions`, the index of its record."""
        return [i for i, record in enumerate(self.records) for _ in record.captions]

    def subset(self, indices: list[int]) -> ImageTextDataset:
        return ImageTextDataset([self.records[i] for i in indices], self.source)

    def load_image(self, index: int, draft: int | None = None) -> Image.Image:
        """Open record `index`'s image as RGB, with a clear error if it is missing or unreadable; `draft`: as
        `open_rgb` (image files only)."""
        record = self.records[index]
        if record.tar_member is None:
            return open_rgb(record.image_path, f" (image_id {record.image_id!r} in {self.source})", draft)
        try:
            shard = self._tar_handles.get(record.image_path)
            if shard is None:  # kept open: every member of the shard is read through it
                shard = self._tar_handles[record.image_path] = tarfile.open(record.image_path)  # noqa: SIM115
            data = shard.extractfile(record.tar_member)
            if data is None:
                raise LaceInputError(f"{record.image_path}: member {record.tar_member!r} is not a file")
            with Image.open(io.BytesIO(data.read())) as image:
                return image.convert("RGB")
        except (UnidentifiedImageError, OSError) as error:
            raise LaceInputError(f"{record.image_path}:{record.tar_member}: unreadable image ({error})") from error

    def missing_images(self) -> list[int]:
        """Indices of records whose image file does not exist (tar members are not checked)."""
        return [i for i, r in enumerate(self.records) if r.tar_member is None and not r.image_path.is_file()]

    def __getstate__(self):  # open tar handles do not cross process boundaries
        state = self.__dict__.copy()
        state["_tar_handles"] = {}
        return state


class ImageRows:
    """Records `rows` of a dataset (default: all) as `transform`ed images: a map-style dataset for a
    `torch.utils.data.DataLoader`, which decodes them in its workers. `draft`: as `open_rgb`."""

    def __init__(self, dataset: ImageTextDataset, transform, rows: Sequence[int] | None = None,
                 draft: int | None = None):
        self.dataset, self.transform, self.draft = dataset, transform, draft
        self.rows = range(len(dataset)) if rows is None else rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        return self.transform(self.dataset.load_image(self.rows[index], self.draft))
