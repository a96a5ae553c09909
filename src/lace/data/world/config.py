"""The shapes world's vocabulary and its generator config.

Every knob of the generator is a field of `WorldConfig`, with its docstring under it
(`lace.config` turns those into CLI help). The vocabulary constants list everything the
renderer can draw; a config picks a subset.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lace.errors import input_error

SHAPES = ("circle", "square", "triangle", "star", "heart", "cross", "diamond", "hexagon")

# Hues spread round the colour wheel (0, 30, 52, 125, 185, 225, 275, 320 degrees) so that
# no two colour words name neighbouring shades, even at 32 px with noise.
PALETTE = {
    "red": (220, 30, 30),
    "orange": (245, 135, 20),
    "yellow": (235, 205, 20),
    "green": (35, 165, 50),
    "cyan": (25, 195, 210),
    "blue": (35, 75, 225),
    "purple": (135, 45, 205),
    "pink": (235, 75, 175),
}
COLOURS = tuple(PALETTE)
SIZES = ("small", "large")
TEXTURES = ("solid", "striped", "dotted")
RELATIONS = ("left of", "right of", "above", "below")
INVERSE_RELATION = {
    "left of": "right of",
    "right of": "left of",
    "above": "below",
    "below": "above",
}
SPLITS = ("train", "val", "test", "test_comp")
CAPTION_STYLES = ("web", "coco")
BENCHMARK_SPLITS = ("val", "test", "test_comp")


@dataclass(frozen=True)
class WorldConfig:
    """How to generate a shapes world: scenes, captions, splits and binding benchmarks."""

    n_images: int = 20000
    """Total number of images over all splits (benchmark negatives not counted)."""
    seed: int = 0
    """Seed of the world: every sample's random stream is derived from (seed, split, index)."""
    image_size: int = 64
    """Canvas side in pixels (square images); shapes stay recognisable down to 32."""
    objects_per_scene: int = 2
    """Objects per scene, 1 to 4. Relations are stated between consecutive objects."""
    shapes: tuple[str, ...] = SHAPES
    """Shape names to draw (subset of the built-in shapes); at least objects_per_scene of them."""
    colours: tuple[str, ...] = COLOURS
    """Colour names to use (subset of the built-in palette); at least objects_per_scene of them."""
    sizes: tuple[str, ...] = SIZES
    """Size words to use (subset of small, large)."""
    textures: tuple[str, ...] = TEXTURES
    """Texture words to use (subset of solid, striped, dotted)."""
    relations: tuple[str, ...] = RELATIONS
    """Spatial relations scenes may show (subset of left of, right of, above, below)."""
    small_extent: float = 0.24
    """Side of a small object's bounding box, as a fraction of the canvas."""
    large_extent: float = 0.38
    """Side of a large object's bounding box, as a fraction of the canvas."""
    scale_jitter: float = 0.08
    """Each object's extent is scaled by a factor drawn from [1 - jitter, 1 + jitter]."""
    rotation_jitter: float = 10.0
    """Largest rotation of an object, in degrees (small, so a square never reads as a diamond)."""
    colour_jitter: int = 12
    """Largest per-channel shift of an object's RGB colour from its palette value."""
    noise_std: float = 6.0
    """Standard deviation of the Gaussian pixel noise added to the whole image (0-255 scale)."""
    clutter: int = 6
    """Largest number of distractor specks and short grey lines drawn under the objects."""
    supersample: int = 2
    """Render at this multiple of the canvas and downsample, for smooth edges at small sizes."""
    split_fractions: tuple[float, ...] = (0.8, 0.1, 0.05, 0.05)
    """Fractions of n_images for train, val, test and test_comp; must sum to 1."""
    holdout_fraction: float = 0.2
    """Share of (colour, shape) pairs held out of train, val and test; only test_comp shows them."""
    cooccurrence_skew: float = 0.7
    """Probability that an object in a skewed split takes its shape's preferred colour."""
    skewed_splits: tuple[str, ...] = ("train",)
    """Splits whose scenes follow the colour-shape skew; the others draw colours uniformly."""
    web_object_prob: float = 0.7
    """Web captions: probability that each object is mentioned (at least one always is)."""
    web_colour_prob: float = 0.5
    """Web captions: probability that a mentioned object's colour is named."""
    web_size_prob: float = 0.15
    """Web captions: probability that a mentioned object's size is named."""
    web_texture_prob: float = 0.15
    """Web captions: probability that a mentioned object's texture is named."""
    web_relation_prob: float = 0.3
    """Web captions: probability of relation words when two related objects are mentioned."""
    web_colour_noise: float = 0.05
    """Web captions: probability that a named colour is replaced by a wrong colour word."""
    web_captions_min: int = 1
    """Web captions per image, lower bound."""
    web_captions_max: int = 2
    """Web captions per image, upper bound (inclusive)."""
    coco_captions: int = 3
    """COCO-like captions per image; each names every object's colour and the relations."""
    coco_size_prob: float = 0.6
    """COCO-like captions: probability that an object's size is named."""
    coco_texture_prob: float = 0.5
    """COCO-like captions: probability that an object's texture is named."""
    benchmark_items_per_family: int = 2
    """Binding items per image and family (fewer when a family has fewer distinct edits)."""
    webdataset: bool = False
    """Also write webdataset tar shards: shards/<split>-%06d.tar with .png, .txt and .json."""
    shard_size: int = 1000
    """Samples per webdataset shard."""
    webdataset_style: str = "web"
    """Caption style whose captions go in the shards' .txt files (one caption per line)."""
    png_compression: int = 1
    """zlib level of the PNG files (0-9); low levels write several times faster."""
    workers: int = 1
    """Processes that render samples; output is identical for any number of workers."""

    def __post_init__(self) -> None:
        validate_config(self)

    def replace(self, **changes: object) -> WorldConfig:
        return dataclasses.replace(self, **changes)


def _check_subset(field: str, values: tuple[str, ...], allowed: tuple[str, ...], minimum: int) -> None:
    unknown = [v for v in values if v not in allowed]
    if unknown or len(set(values)) != len(values) or len(values) < minimum:
        raise input_error("WorldConfig", field, f"at least {minimum} distinct names from {list(allowed)}", values)


SHARES = ("scale_jitter", "holdout_fraction", "cooccurrence_skew", "web_object_prob", "web_colour_prob",
          "web_size_prob", "web_texture_prob", "web_relation_prob", "web_colour_noise", "coco_size_prob",
          "coco_texture_prob")
"""The `WorldConfig` fields that are probabilities or shares, each in [0, 1]."""
COUNTS = ("coco_captions", "benchmark_items_per_family", "shard_size", "supersample", "workers")
"""The `WorldConfig` fields that count something, each at least 1."""


def validate_config(config: WorldConfig) -> None:
    """Raise `LaceInputError` naming the first field that cannot make a world (checked in field order)."""
    _check_scenes(config)
    _check_shares(config)
    _check_captions_and_files(config)


def _check_scenes(config: WorldConfig) -> None:
    """The image count and canvas, the objects per scene and the vocabulary, and the objects' extents."""
    if config.n_images < 1:
        raise input_error("WorldConfig", "n_images", "a positive integer", config.n_images)
    if not 16 <= config.image_size <= 1024:
        raise input_error("WorldConfig", "image_size", "an integer in [16, 1024]", config.image_size)
    if not 1 <= config.objects_per_scene <= 4:
        raise input_error("WorldConfig", "objects_per_scene", "1 to 4", config.objects_per_scene)
    n = config.objects_per_scene
    _check_subset("shapes", config.shapes, SHAPES, max(n, 2))
    _check_subset("colours", config.colours, COLOURS, max(n, 2))
    _check_subset("sizes", config.sizes, SIZES, 1)
    _check_subset("textures", config.textures, TEXTURES, 1)
    _check_subset("relations", config.relations, RELATIONS, 1)
    if not 0 < config.small_extent <= config.large_extent <= 0.5:
        raise input_error("WorldConfig", "small_extent/large_extent", "0 < small <= large <= 0.5",
                          (config.small_extent, config.large_extent))


def _check_shares(config: WorldConfig) -> None:
    """Every probability and share (`SHARES`), the held-out share, the split fractions and the skewed splits."""
    for name in SHARES:
        value = getattr(config, name)
        if not 0.0 <= value <= 1.0:
            raise input_error("WorldConfig", name, "a number in [0, 1]", value)
    if config.holdout_fraction > 0.5:
        raise input_error("WorldConfig", "holdout_fraction", "at most 0.5", config.holdout_fraction)
    fractions = config.split_fractions
    if len(fractions) != 4 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise input_error("WorldConfig", "split_fractions",
                          "4 non-negative fractions (train, val, test, test_comp) summing to 1", fractions)
    if any(s not in SPLITS for s in config.skewed_splits):
        raise input_error("WorldConfig", "skewed_splits", f"names from {list(SPLITS)}", config.skewed_splits)


def _check_captions_and_files(config: WorldConfig) -> None:
    """Captions per image, the counts (`COUNTS`), the shards' caption style, PNG compression and the noise."""
    if not 1 <= config.web_captions_min <= config.web_captions_max:
        raise input_error("WorldConfig", "web_captions_min/max", "1 <= min <= max",
                          (config.web_captions_min, config.web_captions_max))
    for name in COUNTS:
        if getattr(config, name) < 1:
            raise input_error("WorldConfig", name, "an integer >= 1", getattr(config, name))
    if config.webdataset_style not in CAPTION_STYLES:
        raise input_error("WorldConfig", "webdataset_style", f"one of {list(CAPTION_STYLES)}",
                          config.webdataset_style)
    if not 0 <= config.png_compression <= 9:
        raise input_error("WorldConfig", "png_compression", "an integer in [0, 9]", config.png_compression)
    noise = (config.noise_std, config.clutter, config.rotation_jitter, config.colour_jitter)
    if any(value < 0 for value in noise):
        raise input_error("WorldConfig", "noise_std/clutter/rotation_jitter/colour_jitter", "non-negative values",
                          noise)


def world_vocabulary(config: WorldConfig) -> dict:
    """The typed vocabulary of a world, in the format of `lace.concepts.vocabulary`."""
    return {
        "name": "world",
        "objects": list(config.shapes),
        "attributes": {
            "colour": list(config.colours),
            "size": list(config.sizes),
            "texture": list(config.textures),
        },
        "relations": list(config.relations),
    }
