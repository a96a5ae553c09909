"""Draw a scene graph into pixels: grey noisy background, grey clutter, textured shapes.

The image is drawn at `supersample` times the canvas and averaged down, so edges stay
smooth at 32 px. Background level, clutter and pixel noise come from the scene's
`render_seed` alone, never from the objects: an edited scene graph renders with exactly
the same background, and only the edited objects' pixels change.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

from lace.data.world.config import PALETTE, WorldConfig
from lace.errors import input_error

DARK_SHADE = 0.5  # stripes and dots keep the hue at half the brightness


def _heart(points: int = 36) -> list[tuple[float, float]]:
    outline = []
    for k in range(points):
        t = 2 * math.pi * k / points
        x = 16 * math.sin(t) ** 3
        y = -(13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t))
        outline.append((x / 17.0, (y - 2.5) / 16.0))  # y spans [-12, 17]: centre it
    return outline


def _star(tips: int = 5, inner: float = 0.45) -> list[tuple[float, float]]:
    outline = []
    for k in range(2 * tips):
        radius = 1.0 if k % 2 == 0 else inner
        angle = -math.pi / 2 + math.pi * k / tips
        outline.append((radius * math.cos(angle), radius * math.sin(angle) + 0.08))
    return outline


def _regular(sides: int, start: float, radius: float = 1.0) -> list[tuple[float, float]]:
    return [
        (
            radius * math.cos(start + 2 * math.pi * k / sides),
            radius * math.sin(start + 2 * math.pi * k / sides),
        )
        for k in range(sides)
    ]


_ARM = 0.3
# Outlines in a unit box centred on 0 (x right, y down); they fill most of [-1, 1]^2 and
# stay inside it after the small rotations the config allows.
OUTLINES: dict[str, list[tuple[float, float]]] = {
    "circle": _regular(48, 0.0, 1.0),
    "square": [(-0.78, -0.78), (0.78, -0.78), (0.78, 0.78), (-0.78, 0.78)],
    "triangle": [(0.0, -0.85), (0.92, 0.75), (-0.92, 0.75)],
    "star": _star(),
    "heart": _heart(),
    "cross": [
        (-_ARM, -0.95),
        (_ARM, -0.95),
        (_ARM, -_ARM),
        (0.95, -_ARM),
        (0.95, _ARM),
        (_ARM, _ARM),
        (_ARM, 0.95),
        (-_ARM, 0.95),
        (-_ARM, _ARM),
        (-0.95, _ARM),
        (-0.95, -_ARM),
        (-_ARM, -_ARM),
    ],
    "diamond": [(0.0, -1.0), (0.68, 0.0), (0.0, 1.0), (-0.68, 0.0)],
    "hexagon": _regular(6, 0.0, 0.9),  # well inside the circle, so the two stay apart
}


def object_colour(obj: dict) -> tuple[int, int, int]:
    """The object's RGB fill: palette colour plus its per-object shade shift."""
    return tuple(int(min(max(p + d, 0), 255)) for p, d in zip(PALETTE[obj["colour"]], obj["shade"]))


def _outline_pixels(obj: dict, scale: float) -> list[tuple[float, float]]:
    """The object's outline in pixel coordinates of a canvas `scale` times the nominal one."""
    # PIL fills every pixel the outline touches: pull the outline in by half a pixel so that
    # filled areas match the outline's true area.
    radius = obj["extent"] / 2 * scale - 0.5
    theta = math.radians(obj["angle"])
    cos, sin = math.cos(theta), math.sin(theta)
    cx, cy = obj["center"][0] * scale, obj["center"][1] * scale
    return [
        (cx + radius * (x * cos - y * sin), cy + radius * (x * sin + y * cos))
        for x, y in OUTLINES[obj["shape"]]
    ]


def _object_patch(
    obj: dict, scale: int, side: int
) -> tuple[tuple[int, int, int, int], Image.Image]:
    """Box (x0, y0, x1, y1) and coverage mask ("L" image of the box) of the object on a
    `side`-pixel canvas drawn at `scale` times the nominal size."""
    outline = _outline_pixels(obj, scale)
    xs, ys = [p[0] for p in outline], [p[1] for p in outline]
    x0, y0 = max(math.floor(min(xs)) - 1, 0), max(math.floor(min(ys)) - 1, 0)
    x1, y1 = min(math.ceil(max(xs)) + 2, side), min(math.ceil(max(ys)) + 2, side)
    patch = Image.new("L", (x1 - x0, y1 - y0), 0)
    ImageDraw.Draw(patch).polygon([(x - x0, y - y0) for x, y in outline], fill=255)
    return (x0, y0, x1, y1), patch


def _texture_grid(
    texture: str, period: float, height: int, width: int, phase_x: float, phase_y: float
) -> np.ndarray:
    """Where the dark shade goes, (height, width) bool; coordinates relative to the object."""
    ys = np.arange(height, dtype=np.float32)[:, None] + phase_y
    xs = np.arange(width, dtype=np.float32)[None, :] + phase_x
    if texture == "striped":
        return np.mod(xs + ys, period) < period / 2
    if texture == "dotted":
        dx = np.mod(xs, period) - period / 2
        dy = np.mod(ys, period) - period / 2
        return dx * dx + dy * dy < (0.3 * period) ** 2
    return np.zeros((height, width), bool)


def object_coverage(obj: dict, config: WorldConfig) -> np.ndarray:
    """Share of each final pixel the object covers, (image_size, image_size) float in [0, 1]."""
    scale, side = config.supersample, config.image_size * config.supersample
    box, patch = _object_patch(obj, scale, side)
    full = np.zeros((side, side), np.float32)
    full[box[1] : box[3], box[0] : box[2]] = np.asarray(patch) / 255.0
    size = config.image_size
    return full.reshape(size, scale, size, scale).mean(axis=(1, 3))


def object_mask(obj: dict, config: WorldConfig) -> np.ndarray:
    """Pixels the object covers at least half of, (image_size, image_size) bool."""
    return object_coverage(obj, config) >= 0.5


def _background(rng: np.random.Generator, config: WorldConfig) -> Image.Image:
    """Grey canvas with distractor specks and short lines, at the supersampled size."""
    scale, side = config.supersample, config.image_size * config.supersample
    level = int(rng.integers(195, 236))
    image = Image.new("RGB", (side, side), (level, level, level))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, config.clutter + 1))):
        grey = int(rng.integers(90, 171))
        x, y = rng.uniform(0, side, 2)
        if rng.random() < 0.5:
            radius = rng.uniform(0.5, 1.2) * scale
            draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=(grey,) * 3)
        else:
            length = rng.uniform(2.0, 5.0) * scale
            angle = rng.uniform(0, math.pi)
            end = (x + length * math.cos(angle), y + length * math.sin(angle))
            draw.line([(x, y), end], fill=(grey,) * 3, width=max(1, scale // 2))
    return image


@lru_cache(maxsize=4)
def _backdrop(render_seed: int, config: WorldConfig) -> tuple[Image.Image, np.ndarray | None]:
    """Background and integer pixel noise (size, size, 3) of a render seed.

    Cached because a scene's benchmark negatives share its seed and so its backdrop.
    """
    rng = np.random.default_rng(render_seed)
    background = _background(rng, config)
    size = config.image_size
    if config.noise_std <= 0:
        return background, None
    # Pixels are integers, so rounding the noise first gives the same sums as rounding after.
    return background, np.rint(rng.normal(0.0, config.noise_std, (size, size, 3))).astype(np.int16)


def render_scene(scene: dict, config: WorldConfig) -> Image.Image:
    """Render a scene graph to an RGB image of `config.image_size` pixels a side."""
    if scene["image_size"] != config.image_size:
        raise input_error(
            f"scene {scene.get('id')}", "image_size", f"{config.image_size}", scene["image_size"]
        )
    scale, size = config.supersample, config.image_size
    background, noise = _backdrop(scene["render_seed"], config)
    canvas = background.copy()
    for obj in scene["objects"]:
        box, patch = _object_patch(obj, scale, size * scale)
        colour = object_colour(obj)
        canvas.paste(colour, box, patch)
        if obj["texture"] == "solid":
            continue
        period = max(4.0, obj["extent"] / 3) * scale
        dark = _texture_grid(
            obj["texture"],
            period,
            patch.height,
            patch.width,
            # Anchor the pattern to the object's centre so it travels with the object.
            float(np.mod(box[0] - obj["center"][0] * scale, period)),
            float(np.mod(box[1] - obj["center"][1] * scale, period)),
        )
        dark_mask = Image.fromarray(np.where(dark, np.asarray(patch), 0).astype(np.uint8), "L")
        canvas.paste(tuple(round(c * DARK_SHADE) for c in colour), box, dark_mask)
    image = canvas.reduce(scale) if scale > 1 else canvas
    if noise is None:
        return image
    pixels = np.asarray(image).astype(np.int16) + noise
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
