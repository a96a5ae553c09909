"""Fuzzing the benchmark readers (`lace.eval.benchmarks`): SugarCrepe, ARO (VG-Relation, VG-Attribution,
COCO-/Flickr30k-Order), Winoground, VALSE, zero-shot, retrieval and the shapes world.

Each release file is a dump of its format's shape with fields kept, dropped or replaced by any JSON
value (NaN included), or any text or bytes; the images it names exist. `load` either returns items
the scorer can use (aligned lists of non-empty strings, finite boxes of positive size, templates
that format), or raises `LaceInputError` naming the file or folder it refuses.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from lace.eval.benchmarks import get_benchmark
from lace.eval.benchmarks.pairs import PairItems
from lace.eval.benchmarks.sugarcrepe import SUGARCREPE_FILES
from tests.robustness.fuzz_support import JSON_VALUES, expect_input_error, fuzz, near

IMAGES = ("a.png", "b.png")
ANY_FILE = JSON_VALUES.map(json.dumps) | st.text(max_size=30) | st.binary(max_size=30)


def write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def make_images(folder: Path) -> None:
    for name in IMAGES:
        write(folder / name, b"")


def check_pairs(pairs: PairItems) -> None:
    assert len(pairs.image_paths) == len(pairs.captions) == len(pairs.negatives)
    assert all(isinstance(t, str) and t.strip() for t in pairs.captions + pairs.negatives)
    assert all(Path(p).is_file() for p in pairs.image_paths)


SUGARCREPE_ITEMS = {"0": {"filename": "a.png", "caption": "a red cube", "negative_caption": "a blue cube"}}


@fuzz(80)
@given(near(SUGARCREPE_ITEMS) | ANY_FILE, st.sampled_from(SUGARCREPE_FILES))
def test_sugarcrepe(content, broken_file):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_images(root / "val2017")
        for name in SUGARCREPE_FILES:
            write(root / f"{name}.json", content if name == broken_file else SUGARCREPE_ITEMS)
        data = expect_input_error(lambda: get_benchmark("sugarcrepe").load(root), root)
        for pairs in (data or {}).values():
            check_pairs(pairs)


VG_ITEM = {"image_path": "a.png", "bbox_x": 0, "bbox_y": 1.5, "bbox_w": 10, "bbox_h": 4,
           "true_caption": "the cube is left of the ball", "false_caption": "the ball is left of the cube",
           "relation_name": "left of", "attributes": ["red", "blue"]}


@fuzz(100)
@given(near([VG_ITEM]) | ANY_FILE, st.sampled_from(["visual_genome_relation.json", "visual_genome_attribution.json"]))
@example([{**VG_ITEM, "bbox_w": float("nan")}], "visual_genome_relation.json")
@example([{**VG_ITEM, "bbox_h": -3}], "visual_genome_attribution.json")
def test_aro_visual_genome(content, broken_file):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_images(root / "images")
        for name in ("visual_genome_relation.json", "visual_genome_attribution.json"):
            write(root / name, content if name == broken_file else [VG_ITEM])
        data = expect_input_error(lambda: get_benchmark("aro").load(root), root)
    for choice in (data or {}).values():
        assert len(choice.images) == len(choice.true_captions) == len(choice.alternatives) == len(choice.groups)
        for _, box in choice.images:
            assert all(math.isfinite(v) for v in box) and box[2] > 0 and box[3] > 0


KARPATHY = {"images": [{"filename": "a.png", "split": "test", "sentences": [{"raw": "a red cube left of a ball"}]}]}
BLIP_LIST = [{"image": "a.png", "caption": ["a red cube left of a ball", "a dog"]}]


@fuzz(50)
@given(near(KARPATHY) | near(BLIP_LIST) | ANY_FILE)
def test_aro_order(content):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_images(root)
        path = write(root / "coco_karpathy_test.json", content)
        data = expect_input_error(lambda: get_benchmark("aro").load(coco_karpathy=path, coco_images=root), root)
    for choice in (data or {}).values():
        assert len(choice.images) == len(choice.true_captions) == len(choice.alternatives)
        assert all(isinstance(t, str) for options in choice.alternatives for t in options)


WINOGROUND_LINE = {"id": 0, "caption_0": "a cube left of a ball", "caption_1": "a ball left of a cube",
                   "image_0": "a", "image_1": "b"}


@fuzz(80)
@given(st.lists(near(WINOGROUND_LINE).map(json.dumps) | st.text(max_size=20), max_size=3) | st.binary(max_size=30))
@example(b"\x80")  # once a UnicodeDecodeError
def test_winoground(lines):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_images(root / "images")
        write(root / "examples.jsonl", lines if isinstance(lines, bytes) else "\n".join(lines))
        data = expect_input_error(lambda: get_benchmark("winoground").load(root), root)
    if data is not None:
        assert len(data.ids) == len(data.image_paths) == len(data.captions) > 0
        assert all(isinstance(c, str) and c.strip() for pair in data.captions for c in pair)


VALSE_ITEMS = {"7": {"image_file": "a.png", "dataset": "coco", "caption": "there are two dogs", "foil": "one dog",
                     "mturk": {"caption": 3, "foil": 0, "other": 0}}}


@fuzz(100)
@given(near(VALSE_ITEMS) | ANY_FILE, st.booleans())
def test_valse(content, all_items):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_images(root / "images" / "coco")
        write(root / "existence.json", content)
        data = expect_input_error(lambda: get_benchmark("valse").load(root, all_items=all_items), root)
        for pairs in (data or {}).values():
            check_pairs(pairs)


CLASSES = ("cube", "red_ball")
CLASSNAMES = st.one_of(near(["cube", "red ball"]), near({"cube": "cube", "red_ball": "red ball"}),
                       near({"classes": ["cube", "ball"]}), ANY_FILE)
TEMPLATES = st.one_of(near(["a photo of a {c}.", "a {c}"]), near({"default": ["a {c}."]}), ANY_FILE,
                      st.lists(st.text(max_size=6).map(lambda t: t + "{c}") | st.sampled_from(
                          ["{c} {}", "{c} {0}", "{c} {x}", "{c", "}{c}", "{c!r}", "{c:>5}", "{c.upper}"]),
                          min_size=1, max_size=3))


@fuzz(100)
@given(st.none() | CLASSNAMES, st.none() | TEMPLATES, st.sampled_from([".json", ".txt"]))
@example(None, ["a {c} and {}"], ".json")
def test_zeroshot(classnames, templates, suffix):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "classes"
        for name in CLASSES:
            make_images(root / name)
        options = {}
        if classnames is not None:
            options["classnames"] = write(Path(folder) / f"classnames{suffix}", classnames)
        if templates is not None:
            text = templates if isinstance(templates, (str, bytes)) else (
                json.dumps(templates) if suffix == ".json" else "\n".join(map(str, templates)))
            options["templates"] = write(Path(folder) / f"templates{suffix}", text)
        data = expect_input_error(lambda: get_benchmark("zeroshot").load(root, **options), folder)
    for task in (data or {}).values():
        assert len(task.image_paths) == len(task.labels) and len(task.classnames) == len(CLASSES)
        prompts = [template.format(c=name) for name in task.classnames for template in task.templates]
        assert prompts and all(isinstance(p, str) for p in prompts)


@fuzz(60)
@given(near({"images": [{"filename": "a.png", "split": "test", "sentences": [{"raw": "a cube"}]},
                        {"filename": "b.png", "split": "test", "sentences": [{"raw": "a ball"}]}]}) | ANY_FILE)
def test_retrieval(content):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_images(root)
        path = write(root / "dataset.json", content)
        data = expect_input_error(lambda: get_benchmark("retrieval").load(path), path)
    if data is not None:
        assert len(data.dataset) > 0 and all(record.captions for record in data.dataset.records)


WORLD_ITEM = {"family": "colour", "filename": "a.png", "caption": "a red cube", "negative_caption": "a blue cube",
              "negative_filename": "b.png"}
WORLD_QUADRUPLE = {"id": 1, "image_0": "a.png", "image_1": "b.png", "caption_0": "a red cube", "caption_1": "a blue cube"}


@fuzz(80)
@given(near([WORLD_ITEM]) | ANY_FILE, near([WORLD_QUADRUPLE]) | ANY_FILE)
def test_world(items, quadruples):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_images(root)
        write(root / "benchmarks" / "test.json", items)
        write(root / "benchmarks" / "test_winoground.json", quadruples)
        data = expect_input_error(lambda: get_benchmark("world").load(root), root)
    if data is not None:
        assert len(data.families) == len(data.images) == len(data.captions) == len(data.negative_captions)
        assert len(data.winoground.ids) == len(data.winoground.captions)
