"""The shapes world: rendered compositional scenes with scene graphs, captions and binding tests.

    from lace.data.world import WorldConfig, generate_world
    summary = generate_world(WorldConfig(n_images=2000, image_size=32), "runs/world")

See `writer` for the folder layout and `benchmarks` for the binding families.
"""

from lace.data.world.benchmarks import FAMILIES, benchmark_items
from lace.data.world.captions import caption_scene
from lace.data.world.config import WorldConfig, world_vocabulary
from lace.data.world.preview import preview_grid
from lace.data.world.render import render_scene
from lace.data.world.scene import colour_shape_combinations, sample_scene
from lace.data.world.writer import WorldSummary, generate_world

__all__ = [
    "FAMILIES",
    "WorldConfig",
    "WorldSummary",
    "benchmark_items",
    "caption_scene",
    "colour_shape_combinations",
    "generate_world",
    "preview_grid",
    "render_scene",
    "sample_scene",
    "world_vocabulary",
]
