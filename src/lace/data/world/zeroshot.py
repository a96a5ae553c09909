"""Zero-shot classification tasks of a shapes world: shape, colour and count.

Rendered from the world's own config (`world.json`) into one image folder per task, one
subfolder per class, the layout `lace eval --benchmarks zeroshot` reads for any image
folder:

    zeroshot/<task>/<class folder>/<k>.png   (count: folders 1, 2, 3, 4)
    zeroshot/<task>/classnames.json     {class folder: class name}
    zeroshot/<task>/templates.json      prompt templates with "{c}"
    zeroshot/tasks.json                 written last: the tasks, classes and images per class

- shape: one-object scenes; classes are the world's shapes ("a square").
- colour: one-object scenes; classes are the world's colours ("a red shape").
- count: scenes of one to four objects (as many as the world has distinct shapes and
  colours for); classes "one shape", "two shapes", ... The world's captions never state
  a count, so this task asks what the space knows without being taught.

Scenes follow the test distribution (seen colour-shape pairs, no skew), each drawn from
its own seeded stream, so a world's tasks are the same however often they are written.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lace.config import config_to_dict
from lace.data.world.config import WorldConfig
from lace.data.world.folder import read_world_config
from lace.data.world.render import render_scene
from lace.data.world.scene import SPLIT_CODES, colour_shape_combinations, sample_scene
from lace.data.world.writer import encode_png
from lace.errors import LaceInputError
from lace.io import atomic_dir, atomic_write_bytes, atomic_write_json, read_json

ZEROSHOT_DIR = "zeroshot"
TASKS = ("shape", "colour", "count")
STREAM_ZEROSHOT = 4  # after the scene, caption, benchmark and combination streams of scene.py
COUNT_WORDS = ("one", "two", "three", "four")
MAX_COUNT = 4  # the most objects a world scene holds
TEMPLATES = {
    "shape": ["a {c}.", "a photo of a {c}."],
    "colour": ["a {c} shape.", "a photo of a {c} shape."],
    "count": ["{c}.", "a photo of {c}."],
}
MAX_DRAWS_PER_IMAGE = 200  # rejection sampling: a class is drawn about 1 in 8 times


def _rng(config: WorldConfig, task: str, index: int) -> np.random.Generator:
    return np.random.default_rng([config.seed, SPLIT_CODES["test"], index, STREAM_ZEROSHOT, TASKS.index(task)])


def _count_class(n: int) -> str:
    return f"{COUNT_WORDS[n - 1]} shape" + ("s" if n > 1 else "")


def zeroshot_scenes(config: WorldConfig, task: str, per_class: int) -> dict[str, list[dict]]:
    """Class name -> `per_class` scenes of that class, for `task` in TASKS."""
    if task not in TASKS:
        raise LaceInputError(f"world zero-shot task {task!r}: expected one of {TASKS}")
    if task == "count":
        counts = range(1, min(MAX_COUNT, len(config.shapes), len(config.colours)) + 1)
        scenes = {}
        for n in counts:
            counted = config.replace(objects_per_scene=n)
            combinations = colour_shape_combinations(counted)
            scenes[_count_class(n)] = [
                sample_scene(_rng(config, task, 1000 * n + k), counted, "test", combinations, k)
                for k in range(per_class)]
        return scenes
    single = config.replace(objects_per_scene=1)
    combinations = colour_shape_combinations(single)
    classes = list(config.shapes if task == "shape" else config.colours)
    scenes = {name: [] for name in classes}
    draws = 0
    while any(len(found) < per_class for found in scenes.values()):
        if draws > MAX_DRAWS_PER_IMAGE * per_class * len(classes):
            raise LaceInputError(f"world zero-shot task {task!r}: some classes never appear in single-object "
                                 f"test scenes ({[c for c, s in scenes.items() if len(s) < per_class]})")
        scene = sample_scene(_rng(config, task, draws), single, "test", combinations, draws)
        draws += 1
        found = scenes[scene["objects"][0][task]]
        if len(found) < per_class:
            found.append(scene)
    return scenes


def ensure_zeroshot_tasks(world_dir: str | Path, per_class: int = 20) -> Path:
    """`<world>/zeroshot`, written first if missing or made with another `per_class`. Returns the folder.

    Only `world.json` is read, so a read-only world can be scored from a writable folder
    holding a copy of its `world.json`.
    """
    if per_class < 1:
        raise LaceInputError(f"world zero-shot tasks: expected at least 1 image per class (got {per_class})")
    world_dir = Path(world_dir)
    out = world_dir / ZEROSHOT_DIR
    config = read_world_config(world_dir)
    index_path = out / "tasks.json"
    wanted = {"per_class": per_class, "world": config_to_dict(config)}
    if index_path.is_file():
        index = read_json(index_path)
        if isinstance(index, dict) and {k: index.get(k) for k in wanted} == wanted:
            return out
    if not os.access(world_dir, os.W_OK):
        raise LaceInputError(f"{world_dir}: not writable, so its zero-shot tasks cannot be written; copy its "
                             f"world.json into a writable folder and pass that folder instead")
    if out.exists() and not index_path.is_file() and not _unfinished_tasks(out):
        raise LaceInputError(f"{out}: exists but holds no finished zero-shot tasks (no tasks.json) and files that "
                             f"are not zero-shot tasks; remove the folder to have it written again")
    # filled beside `out` and moved in whole: a run killed midway leaves `out` as it was (or absent), and the next
    # one clears the leftover
    with atomic_dir(out) as folder:
        tasks = {task: _write_task(config, task, per_class, folder / task) for task in TASKS}
        atomic_write_json(folder / "tasks.json", {**wanted, "tasks": tasks})
    return out


def _write_task(config: WorldConfig, task: str, per_class: int, task_dir: Path) -> list[str]:
    """Render `task`'s scenes into `task_dir` (one subfolder per class, class names, templates); its class names."""
    scenes = zeroshot_scenes(config, task, per_class)
    # count classes live in folders 1, 2, ... so that folder order is count order
    folders = {name: str(k + 1) if task == "count" else name.replace(" ", "_") for k, name in enumerate(scenes)}
    for name, class_scenes in scenes.items():
        for k, scene in enumerate(class_scenes):
            atomic_write_bytes(task_dir / folders[name] / f"{k:04d}.png",
                               encode_png(render_scene(scene, config), config.png_compression))
    atomic_write_json(task_dir / "classnames.json", {folder: name for name, folder in folders.items()})
    atomic_write_json(task_dir / "templates.json", TEMPLATES[task])
    return list(scenes)


def _unfinished_tasks(out: Path) -> bool:
    """Whether `out` (without tasks.json) holds only task folders: a write of an older lace that wrote the tasks in
    place and was stopped midway, safe to replace."""
    return all(entry.is_dir() and entry.name in TASKS for entry in out.iterdir())
