"""Readers for the image-text formats of this field, all returning `ImageTextDataset`.

- COCO captions JSON (`captions_train2017.json`): `images[].{id, file_name}`,
  `annotations[].{image_id, caption}`.
- Karpathy split JSON (`dataset_coco.json`): `images[].{filepath?, filename, split,
  sentences[].raw}`.
- CSV / TSV: one row per (image, caption); open_clip's `filepath` + `title` columns or
  `image` / `caption` style headers.
- webdataset tar shards: members `<key>.<jpg|png|...>` and `<key>.txt` (one caption per line)
  or `<key>.json` with `caption` / `captions`.

`read_dataset` picks the reader from the file.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import logging
import re
import tarfile
from collections import defaultdict
from pathlib import Path

from lace.data.dataset import ImageTextDataset, ImageTextRecord
from lace.errors import LaceInputError, input_error
from lace.io import read_json
from lace.manifest import verify_nearby

IMAGE_COLUMNS = ("filepath", "image", "image_path", "file_name", "filename", "path")
CAPTION_COLUMNS = ("caption", "title", "text", "sentence")
logger = logging.getLogger(__name__)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
KARPATHY_SPLIT_ALIASES = {"restval": "train"}
PARSED_JSON_BYTES = 32 * 2**20
"""Dataset JSON files up to this size are parsed once per process for each content (hashed, which costs a
tenth of parsing): an evaluation reads the file once per split, and processes forked later inherit the parse."""
PARSED_JSON_FILES = 4
_parsed_json: dict[tuple[str, bytes], object] = {}


def _caption(text: object, where: str, field: str) -> str:
    if not isinstance(text, str):
        raise input_error(where, field, "a caption string", text)
    text = text.strip()
    if not text:
        raise input_error(where, field, "a non-empty caption")
    return text


def _require(entry: dict, key: str, where: str, index: int) -> object:
    if not isinstance(entry, dict) or key not in entry:
        raise input_error(where, f"{index}.{key}", f"field '{key}' to be present")
    return entry[key]


def _image_id(value: object, where: str, field: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise input_error(where, field, "an image id (an integer or a string)", value)
    return value


def _file_name(value: object, where: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise input_error(where, field, "a file name (a non-empty string)", value)
    return value


def read_coco_captions(path: str | Path, image_root: str | Path | None = None, data: object = None) -> ImageTextDataset:
    """COCO captions JSON. Images resolve against `image_root` (default: the folder above
    `annotations/` when the file sits in one, else the file's folder). `data`: the file already parsed."""
    path = Path(path)
    data = read_json(path) if data is None else data
    if not isinstance(data, dict):
        raise input_error(path, None, "a JSON object with 'images' and 'annotations'")
    for key in ("images", "annotations"):
        if not isinstance(data.get(key), list):
            raise input_error(path, key, "a list")
    if image_root is None:
        image_root = path.parent.parent if path.parent.name == "annotations" else path.parent
    image_root = Path(image_root)
    captions: dict[object, list[str]] = defaultdict(list)
    for i, annotation in enumerate(data["annotations"]):
        image_id = _image_id(_require(annotation, "image_id", f"{path}: annotations", i), path,
                             f"annotations.{i}.image_id")
        captions[image_id].append(_caption(_require(annotation, "caption", f"{path}: annotations", i), path, f"annotations.{i}.caption"))
    records = []
    for i, image in enumerate(data["images"]):
        image_id = _image_id(_require(image, "id", f"{path}: images", i), path, f"images.{i}.id")
        file_name = _file_name(_require(image, "file_name", f"{path}: images", i), path, f"images.{i}.file_name")
        if image_id in captions:
            records.append(ImageTextRecord(str(image_id), image_root / str(file_name), tuple(captions[image_id])))
    return ImageTextDataset(records, str(path))


def read_karpathy(path: str | Path, image_root: str | Path | None = None, split: str | None = None,
                  data: object = None) -> ImageTextDataset:
    """Karpathy split JSON; `split` keeps one split (`restval` counts as `train`). `data`: the file already parsed."""
    path = Path(path)
    data = read_json(path) if data is None else data
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise input_error(path, "images", "a list of images with 'filename', 'split' and 'sentences'")
    image_root = Path(image_root) if image_root is not None else path.parent
    records = []
    for i, image in enumerate(data["images"]):
        where = f"{path}: images"
        filename = _file_name(_require(image, "filename", where, i), path, f"images.{i}.filename")
        image_split = _require(image, "split", where, i)
        if not isinstance(image_split, str):
            raise input_error(path, f"images.{i}.split", "a split name (train, val, test, restval)", image_split)
        image_split = KARPATHY_SPLIT_ALIASES.get(image_split, image_split)
        if split is not None and image_split != split:
            continue
        sentences = _require(image, "sentences", where, i)
        if not isinstance(sentences, list) or not sentences:
            raise input_error(path, f"images.{i}.sentences", "a non-empty list")
        texts = tuple(
            _caption(_require(s, "raw", f"{path}: images.{i}.sentences", j), path, f"images.{i}.sentences.{j}.raw")
            for j, s in enumerate(sentences)
        )
        folder = image_root / _file_name(image["filepath"], path, f"images.{i}.filepath") \
            if image.get("filepath") else image_root
        image_id = image.get("cocoid", image.get("imgid", filename))
        records.append(ImageTextRecord(str(image_id), folder / str(filename), texts, split=image_split))
    if split is not None and not records:
        raise input_error(path, "images[].split", f"at least one image of split {split!r}")
    return ImageTextDataset(records, str(path))


def read_csv(
    path: str | Path,
    image_root: str | Path | None = None,
    image_column: str | None = None,
    caption_column: str | None = None,
    separator: str | None = None,
) -> ImageTextDataset:
    """CSV or TSV with a header; rows of the same image are grouped into one record."""
    path = Path(path)
    if not path.is_file():
        raise LaceInputError(f"{path}: file not found")
    separator = _separator(path, separator)
    image_root = Path(image_root) if image_root is not None else path.parent
    try:
        grouped = _csv_captions(path, separator, image_column, caption_column)
    except (UnicodeDecodeError, csv.Error) as error:
        kind = "TSV" if separator == "\t" else "CSV"
        raise LaceInputError(f"{path}: not a readable UTF-8 {kind} file ({error})") from error
    records = [ImageTextRecord(image, image_root / image, tuple(texts)) for image, texts in grouped.items()]
    return ImageTextDataset(records, str(path))


SEPARATOR_NAMES = {"\\t": "\t", "tab": "\t", "comma": ",", "semicolon": ";"}
"""Separators as typed in a shell (`--csv-separator '\\t'`, as open_clip_train takes it) -> the character."""


def _separator(path: Path, given: str | None) -> str:
    """The column separator: `given` (one character, or a name of `SEPARATOR_NAMES`), else tab for a .tsv or
    a .csv whose header has tabs and no commas (said on stderr), else a comma."""
    if given is not None:
        separator = SEPARATOR_NAMES.get(given, given)
        if len(separator) != 1:
            raise input_error(path, "--csv-separator", "one character, or \\t for a tab", given)
        return separator
    if path.suffix.lower() == ".tsv":
        return "\t"
    with open(path, encoding="utf-8", errors="replace") as f:
        header = f.readline()
    if "\t" in header and "," not in header:
        logger.warning("%s: read as tab-separated: its header has tabs and no commas (--csv-separator sets it)", path)
        return "\t"
    return ","


def _csv_captions(path: Path, separator: str, image_column: str | None, caption_column: str | None
                  ) -> dict[str, list[str]]:
    """Image -> its captions, in file order, from a CSV/TSV with a header."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=separator)
        header = reader.fieldnames or []
        image_column = image_column or next((c for c in IMAGE_COLUMNS if c in header), None)
        caption_column = caption_column or next((c for c in CAPTION_COLUMNS if c in header), None)
        if image_column not in header:
            raise input_error(path, "header", f"an image column (one of {IMAGE_COLUMNS})", header)
        if caption_column not in header:
            raise input_error(path, "header", f"a caption column (one of {CAPTION_COLUMNS})", header)
        grouped: dict[str, list[str]] = {}
        for line, row in enumerate(reader, start=2):
            image = (row.get(image_column) or "").strip()
            if not image:
                raise input_error(f"{path}:{line}", image_column, "an image path")
            grouped.setdefault(image, []).append(_caption(row.get(caption_column), f"{path}:{line}", caption_column))
    return grouped


def _expand_shards(pattern: str) -> list[Path]:
    """`data/shard-{000000..000009}.tar` (webdataset brace notation), a glob, or one file."""
    match = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if match:
        first, last = match.groups()
        width = len(first)
        return [Path(pattern[: match.start()] + str(i).zfill(width) + pattern[match.end():])
                for i in range(int(first), int(last) + 1)]
    paths = sorted(Path(p) for p in glob.glob(pattern))
    return paths or [Path(pattern)]


def read_webdataset(pattern: str | Path) -> ImageTextDataset:
    """webdataset tar shards: each key needs an image member and `.txt` or `.json` captions."""
    records = []
    for shard in _expand_shards(str(pattern)):
        if not shard.is_file():
            raise LaceInputError(f"{shard}: shard not found (pattern {pattern})")
        samples: dict[str, dict[str, str]] = defaultdict(dict)
        captions: dict[str, list[str]] = {}
        try:
            with tarfile.open(shard) as tar:
                for member in tar.getmembers():
                    if not member.isfile():
                        continue
                    key, _, extension = member.name.partition(".")
                    extension = "." + extension.lower()
                    if extension in IMAGE_SUFFIXES:
                        samples[key]["image"] = member.name
                    elif extension == ".txt" or (extension == ".json" and key not in captions):
                        found = _member_captions(tar.extractfile(member).read(), extension, f"{shard}:{member.name}")
                        if found is not None:
                            captions[key] = found
        except tarfile.TarError as error:
            raise LaceInputError(f"{shard}: not a readable tar shard ({error})") from error
        for key, members in samples.items():
            if key not in captions or not captions[key]:
                raise input_error(f"{shard}:{key}", "txt", "a caption member (<key>.txt or <key>.json)")
            records.append(ImageTextRecord(key, shard, tuple(captions[key]), tar_member=members["image"]))
    return ImageTextDataset(records, str(pattern))


def _member_captions(data: bytes, extension: str, where: str) -> list[str] | None:
    """Captions of a `.txt` member (one a line) or a `.json` member (`captions` or `caption`); None when
    the JSON names none."""
    try:
        text = data.decode("utf-8")
        if extension == ".txt":
            return [_caption(t, where, "text") for t in text.splitlines() if t.strip()]
        meta = json.loads(text)
    except UnicodeDecodeError as error:
        raise LaceInputError(f"{where}: not UTF-8 text ({error})") from error
    except (json.JSONDecodeError, RecursionError) as error:
        raise LaceInputError(f"{where}: not valid JSON ({error})") from error
    found = meta.get("captions", meta.get("caption")) if isinstance(meta, dict) else None
    if found is None:
        return None
    found = [found] if isinstance(found, str) else found
    if not isinstance(found, list):
        raise input_error(where, "captions", "a caption string or a list of them", found)
    return [_caption(t, where, "caption") for t in found]


def _read_dataset_json(path: str) -> object:
    """The parsed JSON of a dataset file, from the per-process cache when it is small and unchanged; readers
    only read what it returns."""
    file = Path(path)
    if not file.is_file() or file.stat().st_size > PARSED_JSON_BYTES:
        return read_json(file)  # a missing file: the error naming it
    key = (str(file.resolve()), hashlib.blake2b(file.read_bytes(), digest_size=16).digest())
    if key not in _parsed_json:
        if len(_parsed_json) >= PARSED_JSON_FILES:
            del _parsed_json[next(iter(_parsed_json))]
        _parsed_json[key] = read_json(file)
    return _parsed_json[key]


def read_dataset(
    path: str | Path, split: str | None = None, image_root: str | Path | None = None,
    csv_columns: tuple[str | None, str | None, str | None] = (None, None, None),
) -> ImageTextDataset:
    """Read any supported format, chosen from the file name and contents.

    csv_columns: (image column, caption column, separator) of CSV/TSV data; None: the defaults of `read_csv`.
    """
    text = str(path)
    suffix = Path(text).suffix.lower()
    if any(value is not None for value in csv_columns) and suffix not in (".csv", ".tsv"):
        raise input_error(text, None, "CSV or TSV data for --csv-img-key, --csv-caption-key and --csv-separator")
    if "{" not in text and Path(text).is_file():
        verify_nearby(text)  # a file of a folder lace wrote (a world) is checked against its manifest
    if suffix == ".tar" or "{" in text:
        return read_webdataset(text)
    if suffix in (".csv", ".tsv"):
        return read_csv(text, image_root, *csv_columns)
    if suffix == ".json":
        data = _read_dataset_json(text)
        if isinstance(data, dict) and "annotations" in data:
            return read_coco_captions(text, image_root=image_root, data=data)
        if isinstance(data, dict) and "images" in data:
            return read_karpathy(text, image_root=image_root, split=split, data=data)
        raise input_error(text, None, "COCO captions JSON ('images' + 'annotations') or Karpathy JSON ('images' with 'sentences')")
    raise LaceInputError(f"{text}: unknown dataset format; expected .json (COCO or Karpathy), .csv/.tsv, or .tar shards")
