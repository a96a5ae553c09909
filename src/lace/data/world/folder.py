"""Reading a world folder written by `lace world`: its generator config and its scene graphs, validated.

Every reader of a world's files goes through these two, so a broken or foreign folder fails the same way
everywhere, with the file, the field and what was expected.
"""

from __future__ import annotations

import json
from pathlib import Path

from lace.config import config_from_dict
from lace.data.world.config import WorldConfig
from lace.errors import input_error
from lace.io import read_json


def read_world_config(world: str | Path) -> WorldConfig:
    """The `WorldConfig` a finished world folder was written with (the 'config' of its world.json)."""
    path = Path(world) / "world.json"
    if not path.is_file():
        raise input_error(path, None, f"the world.json of a finished shapes world folder (write one with "
                                      f"`lace world --out {Path(world)}`)", "no such file")
    data = read_json(path, dict).get("config")
    if not isinstance(data, dict):
        raise input_error(path, "config", "the generator config (a JSON object)", type(data).__name__)
    return config_from_dict(WorldConfig, data, source=str(path))


def read_scenes(world: str | Path, split: str) -> dict[str, dict]:
    """Scene graphs of one split by scene id (the image file's stem), from `scenes_<split>.jsonl`."""
    path = Path(world) / f"scenes_{split}.jsonl"
    if not path.is_file():
        raise input_error(path, None, f"the scene graphs of split {split!r}", "no such file")
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
        if not isinstance(scene.get("objects"), list):
            raise input_error(f"{path}:{number}", "objects", "a list of the scene's objects", scene.get("objects"))
        scenes[scene["id"]] = scene
    if not scenes:
        raise input_error(path, None, f"the scene graphs of split {split!r}", "an empty file")
    return scenes
