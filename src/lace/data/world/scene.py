"""Scene graphs: sampling objects, placing them, and reading relations off their positions.

A scene is a JSON-ready dict:

    {"id": "train_0000042", "split": "train", "index": 42, "image_size": 64,
     "objects": [{"shape", "colour", "size", "texture", "extent", "angle", "shade",
                  "center": [x, y], "bbox": [x0, y0, x1, y1]}, ...],
     "relations": [{"subject": 0, "relation": "left of", "object": 1}, ...],
     "render_seed": int}

Coordinates are pixels with y pointing down. Everything the renderer needs is in the dict,
so an edited copy renders with the same noise and clutter as the original.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lace.data.world.config import SPLITS, WorldConfig
from lace.errors import LaceInputError, input_error

SPLIT_CODES = {split: code for code, split in enumerate(SPLITS)}
STREAM_SCENE, STREAM_CAPTIONS, STREAM_BENCHMARKS, STREAM_COMBINATIONS = 0, 1, 2, 3
GAP_PX = 1.0  # least empty space between two objects' boxes
MAX_SCENE_ATTEMPTS = 500
MAX_PLACEMENT_ATTEMPTS = 30


def sample_rng(seed: int, split: str, index: int, stream: int) -> np.random.Generator:
    """The random stream of one sample; independent of every other sample and stream."""
    return np.random.default_rng([seed, SPLIT_CODES[split], index, stream])


def scene_id(split: str, index: int) -> str:
    return f"{split}_{index:07d}"


@dataclass(frozen=True)
class Combinations:
    """Which (colour, shape) pairs each split may show, and each shape's preferred colour."""

    preferred_colour: dict[str, str]
    held_out: frozenset[tuple[str, str]]

    def allowed_colours(self, shape: str, colours: tuple[str, ...], held_out: bool) -> list[str]:
        """Colours of `shape` that are held out (`held_out=True`) or seen (`False`)."""
        return [c for c in colours if ((c, shape) in self.held_out) == held_out]


def colour_shape_combinations(config: WorldConfig) -> Combinations:
    """Draw, from the world seed, each shape's preferred colour and the held-out pairs.

    Preferred pairs are never held out. Held-out pairs are spread evenly: no shape and no
    colour loses more than its share, so every shape keeps several colours in train.
    """
    rng = np.random.default_rng([config.seed, STREAM_COMBINATIONS])
    shapes, colours = config.shapes, config.colours
    colour_order = rng.permutation(len(colours))
    preferred = {shape: colours[colour_order[i % len(colours)]] for i, shape in enumerate(shapes)}
    candidates = [(c, s) for s in shapes for c in colours if preferred[s] != c]
    order = rng.permutation(len(candidates))
    target = round(config.holdout_fraction * len(shapes) * len(colours))
    cap_shape = math.ceil(target / len(shapes))
    cap_colour = math.ceil(target / len(colours))
    per_shape = dict.fromkeys(shapes, 0)
    per_colour = dict.fromkeys(colours, 0)
    held_out = []
    for k in order:
        colour, shape = candidates[k]
        if len(held_out) == target:
            break
        # Each scene needs distinct colours: keep at least objects_per_scene seen ones per shape.
        seen_left = len(colours) - per_shape[shape] - 1
        if (
            per_shape[shape] < cap_shape
            and per_colour[colour] < cap_colour
            and (seen_left >= config.objects_per_scene)
        ):
            held_out.append((colour, shape))
            per_shape[shape] += 1
            per_colour[colour] += 1
    return Combinations(preferred_colour=preferred, held_out=frozenset(held_out))


def split_sizes(config: WorldConfig) -> dict[str, int]:
    """Images per split: fractions of n_images, rounding remainders into train."""
    sizes = {
        split: math.floor(config.n_images * f) for split, f in zip(SPLITS, config.split_fractions)
    }
    sizes["train"] += config.n_images - sum(sizes.values())
    return sizes


def relation_between(a: dict, b: dict) -> str:
    """The relation of object `a` to object `b`, read off their centres (y points down)."""
    dx = b["center"][0] - a["center"][0]
    dy = b["center"][1] - a["center"][1]
    if abs(dx) >= abs(dy):
        return "left of" if dx > 0 else "right of"
    return "above" if dy > 0 else "below"


def set_center(obj: dict, x: float, y: float) -> None:
    """Move an object, keeping its bounding box in step."""
    x, y = round(float(x), 2), round(float(y), 2)
    half = obj["extent"] / 2
    obj["center"] = [x, y]
    obj["bbox"] = [round(x - half, 2), round(y - half, 2), round(x + half, 2), round(y + half, 2)]


def stated_relations(objects: list[dict]) -> list[dict]:
    """Relations between consecutive objects, as their positions show them."""
    return [
        {"subject": i, "relation": relation_between(objects[i], objects[i + 1]), "object": i + 1}
        for i in range(len(objects) - 1)
    ]


def center_range(config: WorldConfig) -> tuple[float, float]:
    """Where a centre may lie so that any object, of any size, fits inside the canvas.

    Using the largest possible extent for everyone lets two objects trade places safely.
    """
    half_max = config.large_extent * config.image_size * (1 + config.scale_jitter) / 2
    return half_max + GAP_PX, config.image_size - half_max - GAP_PX


def boxes_apart(a: dict, b: dict) -> bool:
    ax0, ay0, ax1, ay1 = a["bbox"]
    bx0, by0, bx1, by1 = b["bbox"]
    return ax1 + GAP_PX <= bx0 or bx1 + GAP_PX <= ax0 or ay1 + GAP_PX <= by0 or by1 + GAP_PX <= ay0


def layout_is_valid(objects: list[dict], config: WorldConfig) -> bool:
    """All centres in range and no two boxes touching."""
    low, high = center_range(config)
    for obj in objects:
        if not all(low - 1e-6 <= v <= high + 1e-6 for v in obj["center"]):
            return False
    return all(boxes_apart(objects[i], objects[j]) for i in range(len(objects)) for j in range(i))


AXES = {"left of": (0, 1), "right of": (0, -1), "above": (1, 1), "below": (1, -1)}
"""Relation of the previous object to the next -> (axis the next one moves along, sign)."""


def _sample_attributes(
    rng: np.random.Generator, config: WorldConfig, combinations: Combinations, split: str
) -> list[dict] | None:
    n = config.objects_per_scene
    shapes = [config.shapes[k] for k in rng.permutation(len(config.shapes))[:n]]
    novel_slot = int(rng.integers(n)) if split == "test_comp" else -1
    skewed = split in config.skewed_splits
    objects, used = [], set()
    for slot, shape in enumerate(shapes):
        if split == "test_comp" and slot != novel_slot:
            options = list(config.colours)  # the rest of a test_comp scene is unconstrained
        else:
            options = combinations.allowed_colours(
                shape, config.colours, held_out=slot == novel_slot
            )
        options = [c for c in options if c not in used]
        if not options:
            return None
        preferred = combinations.preferred_colour[shape]
        others = [c for c in options if c != preferred]
        if (
            skewed
            and preferred in options
            and (not others or rng.random() < config.cooccurrence_skew)
        ):
            colour = preferred
        else:
            colour = others[int(rng.integers(len(others)))] if others else options[0]
        used.add(colour)
        size = config.sizes[int(rng.integers(len(config.sizes)))]
        base = config.large_extent if size == "large" else config.small_extent
        scale = 1 + rng.uniform(-config.scale_jitter, config.scale_jitter)
        objects.append(
            {
                "shape": shape,
                "colour": colour,
                "size": size,
                "texture": config.textures[int(rng.integers(len(config.textures)))],
                "extent": round(float(base * config.image_size * scale), 2),
                "angle": round(
                    float(rng.uniform(-config.rotation_jitter, config.rotation_jitter)), 2
                ),
                "shade": [
                    int(v) for v in rng.integers(-config.colour_jitter, config.colour_jitter + 1, 3)
                ],
            }
        )
    return objects


def _place(rng: np.random.Generator, objects: list[dict], config: WorldConfig) -> bool:
    """Place objects one after another, each in a random relation to the one before.

    Distances are drawn straight from the interval that keeps the object on the canvas, so
    small canvases need few retries; only clashes with older objects are rejected.
    """
    low, high = center_range(config)
    set_center(objects[0], rng.uniform(low, high), rng.uniform(low, high))
    for i in range(1, len(objects)):
        previous, current = objects[i - 1], objects[i]
        least = (previous["extent"] + current["extent"]) / 2 + GAP_PX
        for _ in range(MAX_PLACEMENT_ATTEMPTS):
            relation = config.relations[int(rng.integers(len(config.relations)))]
            axis, sign = AXES[relation]
            start = previous["center"][axis]
            room = (high - start) if sign > 0 else (start - low)
            most = min(room, least + 0.4 * config.image_size)
            if most < least:
                continue
            distance = rng.uniform(least, most)
            # Keep the off-axis shift well under the main one so only one relation reads true.
            other = previous["center"][1 - axis]
            minor = rng.uniform(
                max(-0.4 * distance, low - other), min(0.4 * distance, high - other)
            )
            position = [0.0, 0.0]
            position[axis] = start + sign * distance
            position[1 - axis] = other + minor
            set_center(current, *position)
            if (
                layout_is_valid(objects[: i + 1], config)
                and relation_between(previous, current) == relation
            ):
                break
        else:
            return False
    return True


def sample_scene(
    rng: np.random.Generator,
    config: WorldConfig,
    split: str,
    combinations: Combinations | None = None,
    index: int = 0,
) -> dict:
    """Draw one scene of `split` from `rng`.

    train/val/test scenes only show seen (colour, shape) pairs; every test_comp scene shows
    at least one held-out pair. Splits in `config.skewed_splits` give each object its shape's
    preferred colour with probability `cooccurrence_skew`. Objects have distinct shapes and
    distinct colours, never overlap, and consecutive objects stand in a relation from
    `config.relations`.
    """
    if split not in SPLIT_CODES:
        raise input_error("sample_scene", "split", f"one of {list(SPLITS)}", split)
    combinations = combinations or colour_shape_combinations(config)
    if split == "test_comp" and not combinations.held_out:
        raise input_error("WorldConfig", "holdout_fraction", "> 0 when test_comp has images", 0)
    for _ in range(MAX_SCENE_ATTEMPTS):
        objects = _sample_attributes(rng, config, combinations, split)
        if objects is not None and _place(rng, objects, config):
            return {
                "id": scene_id(split, index),
                "split": split,
                "index": index,
                "image_size": config.image_size,
                "objects": objects,
                "relations": stated_relations(objects),
                "render_seed": int(rng.integers(2**31 - 1)),
            }
    raise LaceInputError(
        f"WorldConfig: {config.objects_per_scene} objects do not fit on a {config.image_size} px "
        "canvas; raise image_size or lower large_extent/small_extent"
    )
