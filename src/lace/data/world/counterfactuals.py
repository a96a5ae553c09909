"""The world's real counterfactual of a scene: the same scene re-rendered with two objects' colours swapped.

Only the shapes world can draw these; the training ceiling arm uses them as text->image negatives.
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from lace.data.world.benchmarks import apply_edit
from lace.data.world.config import WorldConfig
from lace.data.world.render import render_scene
from lace.errors import input_error
from lace.io import read_json
from lace.manifest import verify


def colour_swapped(scene: dict, config: WorldConfig) -> dict | None:
    """`scene` with the colours of its first two differently coloured objects exchanged; None if it has no such pair."""
    objects = scene["objects"]
    for i in range(len(objects)):
        for j in range(i + 1, len(objects)):
            if objects[i]["colour"] != objects[j]["colour"]:
                return apply_edit(scene, "swap_attribute", {"objects": [i, j], "field": "colour"}, config)
    return None


def read_world_config(world: str | Path) -> WorldConfig:
    """The `WorldConfig` a world folder was written with (its world.json)."""
    path = Path(world) / "world.json"
    if not path.is_file():
        raise input_error(path, None, "the world.json of a shapes world folder", "no such file")
    verify(world, ("world.json",))
    data = read_json(path, dict).get("config")
    if not isinstance(data, dict):
        raise input_error(path, "config", "the generator config (a JSON object)", type(data).__name__)
    try:
        return WorldConfig(**{key: tuple(value) if isinstance(value, list) else value for key, value in data.items()})
    except TypeError as error:
        raise input_error(path, "config", "the fields of a WorldConfig", str(error)) from error


def read_scenes(world: str | Path, split: str) -> dict[str, dict]:
    """Scene graphs of one split by scene id (the image file's stem)."""
    path = Path(world) / f"scenes_{split}.jsonl"
    if not path.is_file():
        raise input_error(path, None, f"the scene graphs of split {split!r}", "no such file")
    verify(world, (path.name,))
    scenes = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise input_error(path, None, "UTF-8 JSON lines", str(error)) from error
    for number, line in enumerate(lines, start=1):
        try:
            scene = json.loads(line)
        except json.JSONDecodeError as error:
            raise input_error(f"{path}:{number}", None, "one JSON scene graph per line", str(error)) from error
        if not isinstance(scene, dict) or not isinstance(scene.get("id"), str):
            raise input_error(f"{path}:{number}", "id", "a scene graph with a string id", line[:80])
        scenes[scene["id"]] = scene
    if not scenes:
        raise input_error(path, None, f"the scene graphs of split {split!r}", "an empty file")
    return scenes


def render_colour_swaps(world: str | Path, scene_ids: list[str]) -> list[Image.Image | None]:
    """One colour-swapped rendering per scene id (None where the scene has no two colours to swap)."""
    config = read_world_config(world)
    scenes: dict[str, dict] = {}
    for split in sorted({scene_id.rsplit("_", 1)[0] for scene_id in scene_ids}):
        scenes.update(read_scenes(world, split))
    missing = [scene_id for scene_id in scene_ids if scene_id not in scenes]
    if missing:
        raise input_error(world, "scenes", "a scene graph for every training image", missing[:3])
    rendered = []
    for scene_id in scene_ids:
        swapped = colour_swapped(scenes[scene_id], config)
        rendered.append(render_scene(swapped, config) if swapped is not None else None)
    return rendered
