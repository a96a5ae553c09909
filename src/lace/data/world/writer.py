"""Generate a whole world folder: images, captions in both styles, scenes, benchmarks.

Layout (docs/ARCHITECTURE.md):

    images/<split>/<id>.png                       the images
    annotations/captions_<split>_<style>.json     COCO captions, style in {web, coco}
    karpathy_<style>.json                         Karpathy split file over all splits
    scenes_<split>.jsonl                          one scene graph per line
    benchmarks/<split>.json                       binding items (val, test, test_comp)
    benchmarks/<split>_winoground.json            Winoground-style quadruples
    benchmarks/images/<split>/<id>_<family>_<k>.png   negative images
    shards/<split>-%06d.tar                       webdataset shards (optional)
    vocabulary.yaml, world.json

Every sample is a pure function of (config, split, index), so the output is byte-identical
for a seed whatever the number of workers. Index files are written atomically; `world.json`
is written last and marks a finished world.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from lace.config import config_to_dict
from lace.data.world.benchmarks import benchmark_items, winoground_item
from lace.data.world.captions import caption_scene, caption_tokens
from lace.data.world.config import (
    BENCHMARK_SPLITS,
    CAPTION_STYLES,
    SPLITS,
    WorldConfig,
    world_vocabulary,
)
from lace.data.world.render import render_scene
from lace.data.world.scene import (
    STREAM_BENCHMARKS,
    STREAM_CAPTIONS,
    STREAM_SCENE,
    Combinations,
    colour_shape_combinations,
    sample_rng,
    sample_scene,
    split_sizes,
)
from lace.io import atomic_path, atomic_write_json, atomic_write_text, prepare_output_dir
from lace.manifest import write_manifest
from lace.progress import bar as progress_bar


def _write_compact_json(path: Path, obj: object) -> None:
    """Compact JSON for the large index files (the indented encoder is several times slower)."""
    atomic_write_text(path, json.dumps(obj, separators=(",", ":")) + "\n")


@dataclass
class WorldSummary:
    """What `generate_world` wrote and how fast."""

    out_dir: Path
    images: dict[str, int]
    """Images per split."""
    benchmark_items: dict[str, int]
    """Binding items per benchmark split."""
    winoground_items: dict[str, int]
    seconds: float
    images_per_second: float
    """Dataset images per second, everything included (captions, benchmarks, writing)."""
    rendered_per_second: float
    """All PNGs per second, benchmark negatives included."""
    cpu_seconds: float
    """CPU time of the generating process (excludes worker processes when workers > 1)."""


def encode_png(image, compression: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=compression)
    return buffer.getvalue()


def _distinct_captions(scene: dict, rng, style: str, config: WorldConfig, count: int) -> list[str]:
    """`count` captions, distinct where the grammar allows (a few redraws at most)."""
    captions: list[str] = []
    for _ in range(4 * count):
        caption = caption_scene(scene, rng, style, config)
        if caption not in captions:
            captions.append(caption)
        if len(captions) == count:
            break
    while len(captions) < count:
        captions.append(caption_scene(scene, rng, style, config))
    return captions


def build_sample(config: WorldConfig, combinations: Combinations, split: str, index: int) -> dict:
    """Scene, captions, PNG bytes and benchmark items of one sample."""
    scene = sample_scene(
        sample_rng(config.seed, split, index, STREAM_SCENE), config, split, combinations, index
    )
    caption_rng = sample_rng(config.seed, split, index, STREAM_CAPTIONS)
    n_web = int(caption_rng.integers(config.web_captions_min, config.web_captions_max + 1))
    captions = {
        "coco": _distinct_captions(scene, caption_rng, "coco", config, config.coco_captions),
        "web": _distinct_captions(scene, caption_rng, "web", config, n_web),
    }
    sample = {
        "scene": scene,
        "captions": captions,
        "png": encode_png(render_scene(scene, config), config.png_compression),
    }
    if split in BENCHMARK_SPLITS:
        rng = sample_rng(config.seed, split, index, STREAM_BENCHMARKS)
        items = benchmark_items(scene, rng, config)
        for k, item in enumerate(items):
            item["negative_png"] = encode_png(
                render_scene(item.pop("negative_scene"), config), config.png_compression
            )
            item["negative_name"] = f"{scene['id']}_{item['family']}_{k}.png"
        sample["items"] = items
        sample["winoground"] = winoground_item(scene, items, rng)
    return sample


_WORKER_STATE: dict = {}


def _init_worker(config: WorldConfig, combinations: Combinations) -> None:
    _WORKER_STATE.update(config=config, combinations=combinations)


def _build_in_worker(task: tuple[str, int]) -> dict:
    return build_sample(_WORKER_STATE["config"], _WORKER_STATE["combinations"], *task)


class _ShardWriter:
    """Webdataset tar shards with fixed metadata, so the bytes depend only on the content."""

    def __init__(self, folder: Path, split: str, shard_size: int):
        self.folder, self.split, self.shard_size = folder, split, shard_size
        self.members: list[tuple[str, bytes]] = []
        self.samples, self.shards = 0, 0
        self.paths: list[Path] = []

    def add(self, key: str, png: bytes, text: str, meta: dict) -> None:
        self.members += [
            (f"{key}.png", png),
            (f"{key}.txt", text.encode("utf-8")),
            (f"{key}.json", json.dumps(meta, sort_keys=True).encode("utf-8")),
        ]
        self.samples += 1
        if self.samples == self.shard_size:
            self.flush()

    def flush(self) -> None:
        if not self.members:
            return
        path = self.folder / f"{self.split}-{self.shards:06d}.tar"
        with atomic_path(path) as tmp, tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in self.members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
        self.paths.append(path)
        self.members, self.samples = [], 0
        self.shards += 1


def _samples(config: WorldConfig, combinations: Combinations, tasks: list[tuple[str, int]]):
    if config.workers == 1:
        for split, index in tasks:
            yield build_sample(config, combinations, split, index)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(
        config.workers, initializer=_init_worker, initargs=(config, combinations)
    ) as pool:
        yield from pool.imap(_build_in_worker, tasks, chunksize=32)


class _WorldFiles:
    """The world's output formats, filled image by image and written at the end: PNGs, COCO captions
    and Karpathy JSON per caption style, scene graphs, binding and Winoground items, webdataset shards."""

    def __init__(self, config: WorldConfig, out: Path):
        self.config, self.out = config, out
        self.coco = {(s, style): {"images": [], "annotations": []} for s in SPLITS for style in CAPTION_STYLES}
        self.karpathy = {style: [] for style in CAPTION_STYLES}
        self.scenes = {s: [] for s in SPLITS}
        self.items = {s: [] for s in BENCHMARK_SPLITS}
        self.winoground = {s: [] for s in BENCHMARK_SPLITS}
        self.shards = ({s: _ShardWriter(out / "shards", s, config.shard_size) for s in SPLITS}
                       if config.webdataset else {})
        self.next_caption_id = dict.fromkeys(CAPTION_STYLES, 0)
        self.rendered = 0
        for split in SPLITS:
            (out / "images" / split).mkdir(parents=True, exist_ok=True)

    def add(self, image_id: int, sample: dict) -> None:
        """One rendered scene: its image, captions, scene graph, shard entry and benchmark items."""
        scene, captions = sample["scene"], sample["captions"]
        split = scene["split"]
        file_name = f"images/{split}/{scene['id']}.png"
        (self.out / file_name).write_bytes(sample["png"])
        self.rendered += 1
        self.scenes[split].append(json.dumps(scene, sort_keys=True))
        for style in CAPTION_STYLES:
            self._add_captions(image_id, split, scene, file_name, style, captions[style])
        if self.config.webdataset:
            style = self.config.webdataset_style
            self.shards[split].add(scene["id"], sample["png"], "\n".join(captions[style]),
                                   {"scene": scene, "captions": captions[style], "captions_by_style": captions})
        if split in BENCHMARK_SPLITS:
            self._add_benchmark(split, scene, file_name, sample)

    def _add_captions(self, image_id: int, split: str, scene: dict, file_name: str, style: str,
                      captions: list[str]) -> None:
        record = {"id": image_id, "file_name": file_name, "width": self.config.image_size,
                  "height": self.config.image_size}
        self.coco[split, style]["images"].append(record)
        sentences = []
        for caption in captions:
            sentence_id = self.next_caption_id[style]
            self.next_caption_id[style] += 1
            self.coco[split, style]["annotations"].append({"id": sentence_id, "image_id": image_id, "caption": caption})
            sentences.append({"raw": caption, "tokens": caption_tokens(caption), "imgid": image_id,
                              "sentid": sentence_id})
        self.karpathy[style].append({
            "filepath": f"images/{split}", "filename": f"{scene['id']}.png", "split": split, "imgid": image_id,
            "cocoid": image_id, "sentids": [s["sentid"] for s in sentences], "sentences": sentences,
        })

    def _add_benchmark(self, split: str, scene: dict, file_name: str, sample: dict) -> None:
        negative_folder = self.out / "benchmarks" / "images" / split
        negative_folder.mkdir(parents=True, exist_ok=True)
        for item in sample["items"]:
            (negative_folder / item["negative_name"]).write_bytes(item["negative_png"])
            self.rendered += 1
            item["record"] = {
                "family": item["family"], "filename": file_name, "caption": item["caption"],
                "negative_caption": item["negative_caption"],
                "negative_filename": f"benchmarks/images/{split}/{item['negative_name']}",
                "scene_id": scene["id"], "edit": item["edit"],
            }
            self.items[split].append(item["record"])
        chosen = sample["winoground"]
        if chosen is not None:
            record = chosen["record"]
            self.winoground[split].append({
                "id": f"{scene['id']}_{record['family']}", "family": record["family"],
                "image_0": record["filename"], "image_1": record["negative_filename"],
                "caption_0": record["caption"], "caption_1": record["negative_caption"],
            })

    def write(self) -> None:
        """Every JSON, JSONL and YAML file of the world (the PNGs are written as they come)."""
        out = self.out
        for writer in self.shards.values():
            writer.flush()
        for (split, style), content in self.coco.items():
            _write_compact_json(out / "annotations" / f"captions_{split}_{style}.json", content)
        for style, images in self.karpathy.items():
            _write_compact_json(out / f"karpathy_{style}.json", {"images": images, "dataset": "world"})
        for split, lines in self.scenes.items():
            atomic_write_text(out / f"scenes_{split}.jsonl", "".join(line + "\n" for line in lines))
        for split in BENCHMARK_SPLITS:
            _write_compact_json(out / "benchmarks" / f"{split}.json", self.items[split])
            atomic_write_json(out / "benchmarks" / f"{split}_winoground.json", self.winoground[split])
        atomic_write_text(out / "vocabulary.yaml", yaml.safe_dump(world_vocabulary(self.config), sort_keys=False))


def generate_world(
    config: WorldConfig, out_dir: str | Path, overwrite: bool = False, progress: bool = True
) -> WorldSummary:
    """Write a shapes world for `config` into `out_dir` (a non-empty one only with `overwrite`)."""
    out = prepare_output_dir(out_dir, overwrite)
    start = time.perf_counter()  # after clearing an old folder, which is not generation work
    cpu_start = time.process_time()  # this process's CPU time: fair on a busy machine (workers=1)
    combinations = colour_shape_combinations(config)
    sizes = split_sizes(config)
    tasks = [(split, index) for split in SPLITS for index in range(sizes[split])]
    files = _WorldFiles(config, out)
    samples = progress_bar(_samples(config, combinations, tasks), total=len(tasks), desc="world", unit="img",
                           enabled=progress)
    for image_id, sample in enumerate(samples):
        files.add(image_id, sample)
    files.write()
    rendered, items_out, winoground = files.rendered, files.items, files.winoground
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    summary = WorldSummary(
        out_dir=out,
        images=sizes,
        benchmark_items={s: len(v) for s, v in items_out.items()},
        winoground_items={s: len(v) for s, v in winoground.items()},
        seconds=seconds,
        images_per_second=len(tasks) / seconds,
        rendered_per_second=rendered / seconds,
        cpu_seconds=cpu_seconds,
    )
    atomic_write_json(
        out / "world.json",
        {
            "config": config_to_dict(config),
            "seed": config.seed,
            "counts": {
                "images": sizes,
                "benchmark_items": summary.benchmark_items,
                "winoground_items": summary.winoground_items,
                "rendered_pngs": rendered,
            },
            "preferred_colour": combinations.preferred_colour,
            "held_out_pairs": sorted([list(pair) for pair in combinations.held_out]),
            "throughput": {
                "seconds": round(seconds, 3),
                "images_per_second": round(summary.images_per_second, 1),
                "rendered_per_second": round(summary.rendered_per_second, 1),
                "cpu_seconds": round(cpu_seconds, 3),
                "workers": config.workers,
            },
        },
    )
    write_manifest(out)  # last: every file of the world, images included
    return summary
