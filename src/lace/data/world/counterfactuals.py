"""The world's real counterfactual of a scene: the same scene re-rendered with two objects' colours swapped.

Only the shapes world can draw these; the training ceiling arm uses them as text->image negatives.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from lace.data.world.benchmarks import apply_edit
from lace.data.world.config import WorldConfig
from lace.data.world.folder import read_scenes, read_world_config
from lace.data.world.render import render_scene
from lace.errors import input_error


def swapped_pair(scene: dict) -> tuple[int, int] | None:
    """The first two differently coloured objects of `scene` (their indices), the pair its swap exchanges; None if
    every object has one colour."""
    objects = scene["objects"]
    for i in range(len(objects)):
        for j in range(i + 1, len(objects)):
            if objects[i]["colour"] != objects[j]["colour"]:
                return i, j
    return None


def colour_swapped(scene: dict, config: WorldConfig) -> dict | None:
    """`scene` with the colours of its first two differently coloured objects exchanged; None if it has no such pair."""
    pair = swapped_pair(scene)
    if pair is None:
        return None
    return apply_edit(scene, "swap_attribute", {"objects": list(pair), "field": "colour"}, config)


def swapped_colours(world: str | Path, scene_ids: list[str]) -> list[dict[str, str] | None]:
    """What each scene's colour swap changes, as words: {"red": "blue", "blue": "red"} (None where nothing is
    swapped). The caption of a swapped rendering is written from this by the rule editor, never from the scene."""
    scenes = _scenes(world, scene_ids)
    changes = []
    for scene_id in scene_ids:
        pair = swapped_pair(scenes[scene_id])
        if pair is None:
            changes.append(None)
            continue
        a, b = (scenes[scene_id]["objects"][k]["colour"] for k in pair)
        changes.append({a: b, b: a})
    return changes


def _scenes(world: str | Path, scene_ids: list[str]) -> dict[str, dict]:
    scenes: dict[str, dict] = {}
    for split in sorted({scene_id.rsplit("_", 1)[0] for scene_id in scene_ids}):
        scenes.update(read_scenes(world, split))
    missing = [scene_id for scene_id in scene_ids if scene_id not in scenes]
    if missing:
        raise input_error(world, "scenes", "a scene graph for every training image", missing[:3])
    return scenes


def render_colour_swaps(world: str | Path, scene_ids: list[str]) -> list[Image.Image | None]:
    """One colour-swapped rendering per scene id (None where the scene has no two colours to swap)."""
    config = read_world_config(world)
    scenes = _scenes(world, scene_ids)
    rendered = []
    for scene_id in scene_ids:
        swapped = colour_swapped(scenes[scene_id], config)
        rendered.append(render_scene(swapped, config) if swapped is not None else None)
    return rendered
