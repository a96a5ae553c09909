"""A contact sheet of a world: sample images, enlarged, each with one caption under it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from lace.errors import LaceInputError
from lace.io import atomic_path

TILE = 160
TEXT_LINES = 4
LINE_HEIGHT = 12
WRAP = 30


def preview_grid(
    world_dir: str | Path, path: str | Path, n: int = 16, split: str = "train", style: str = "coco"
) -> Path:
    """Write a PNG grid of the first `n` images of `split` with their first `style` caption."""
    world_dir = Path(world_dir)
    annotations = world_dir / "annotations" / f"captions_{split}_{style}.json"
    if not annotations.is_file():
        raise LaceInputError(
            f"{annotations}: not found; is {world_dir} a world folder written by `lace world`?"
        )
    content = json.loads(annotations.read_text())
    first_caption: dict[int, str] = {}
    for note in content["annotations"]:
        first_caption.setdefault(note["image_id"], note["caption"])
    images = content["images"][:n]
    if not images:
        raise LaceInputError(f"{annotations}: no images in split {split!r}")
    columns = min(4, len(images))
    rows = -(-len(images) // columns)
    cell_height = TILE + TEXT_LINES * LINE_HEIGHT + 6
    sheet = Image.new("RGB", (columns * TILE, rows * cell_height), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for k, record in enumerate(images):
        x, y = (k % columns) * TILE, (k // columns) * cell_height
        tile = (
            Image.open(world_dir / record["file_name"])
            .convert("RGB")
            .resize((TILE - 4, TILE - 4), Image.NEAREST)
        )
        sheet.paste(tile, (x + 2, y + 2))
        lines = textwrap.wrap(first_caption.get(record["id"], ""), WRAP)[:TEXT_LINES]
        for line_number, line in enumerate(lines):
            draw.text((x + 3, y + TILE + line_number * LINE_HEIGHT), line, fill="black", font=font)
    path = Path(path)
    with atomic_path(path) as tmp:
        sheet.save(tmp, format="PNG")
    return path
