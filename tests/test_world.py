"""The shapes world: determinism, captions and pixels that match the scene graphs, negatives
that change exactly one thing, held-out pairs, readers, and the `lace world` command."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from lace.data.world import (
    FAMILIES,
    WorldConfig,
    benchmark_items,
    caption_scene,
    colour_shape_combinations,
    generate_world,
    render_scene,
    sample_scene,
    world_vocabulary,
)
from lace.data.world.config import (
    COLOURS,
    INVERSE_RELATION,
    PALETTE,
    RELATIONS,
    SHAPES,
    SIZES,
    TEXTURES,
)
from lace.data.world.render import OUTLINES, object_coverage, object_mask
from lace.data.world.scene import sample_rng
from lace.errors import LaceInputError

SMALL = {"n_images": 160, "image_size": 32, "split_fractions": (0.5, 0.2, 0.15, 0.15)}
RELATION_WORDS = {
    "to the left of": "left of",
    "on the left of": "left of",
    "left of": "left of",
    "to the right of": "right of",
    "on the right of": "right of",
    "right of": "right of",
    "above": "above",
    "over": "above",
    "below": "below",
    "under": "below",
    "beneath": "below",
}
NOUN_PHRASE = re.compile(
    rf"\b(?:a|an) (?:({'|'.join(SIZES)}) )?(?:({'|'.join(TEXTURES)}) )?({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})\b"
)
ARTICLES = {"a", "an"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world") / "w"
    generate_world(WorldConfig(**SMALL, webdataset=True, shard_size=40), out, progress=False)
    return out


def _scenes(world: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (world / f"scenes_{split}.jsonl").read_text().splitlines()]


def _relation(a: dict, b: dict) -> str:
    """Reference reading of a relation from two centres (y points down)."""
    dx, dy = b["center"][0] - a["center"][0], b["center"][1] - a["center"][1]
    if abs(dx) >= abs(dy):
        return "left of" if dx > 0 else "right of"
    return "above" if dy > 0 else "below"


def _file_hashes(folder: Path) -> dict[str, str]:
    hashes = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in ("world.json", "manifest.json"):  # timings, and their hash
            hashes[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def _world_json_without_timing(folder: Path) -> dict:
    content = json.loads((folder / "world.json").read_text())
    content.pop("throughput")
    content["config"].pop("workers")
    return content


@pytest.mark.slow
def test_same_seed_gives_byte_identical_output_for_any_worker_count(tmp_path):
    config = WorldConfig(n_images=48, image_size=32, webdataset=True, shard_size=16)
    generate_world(config, tmp_path / "a", progress=False)
    generate_world(config, tmp_path / "b", progress=False)
    generate_world(config.replace(workers=2), tmp_path / "c", progress=False)
    generate_world(config.replace(seed=1), tmp_path / "d", progress=False)
    hashes = _file_hashes(tmp_path / "a")
    assert len(hashes) > 48 * 2  # images, negatives, shards, index files
    assert hashes == _file_hashes(tmp_path / "b") == _file_hashes(tmp_path / "c")
    assert _world_json_without_timing(tmp_path / "a") == _world_json_without_timing(tmp_path / "c")
    assert hashes != _file_hashes(tmp_path / "d")


def test_world_folder_follows_the_documented_layout(world):
    for split in ("train", "val", "test", "test_comp"):
        for style in ("web", "coco"):
            coco = json.loads(
                (world / "annotations" / f"captions_{split}_{style}.json").read_text()
            )
            assert coco["images"] and coco["annotations"]
            assert all((world / image["file_name"]).is_file() for image in coco["images"])
            per_image = np.bincount([a["image_id"] for a in coco["annotations"]])
            ids = [image["id"] for image in coco["images"]]
            counts = per_image[ids]
            assert counts.min() >= 1 and counts.max() <= (3 if style == "coco" else 2)
            if style == "coco":
                assert (counts == 3).all()
    karpathy = json.loads((world / "karpathy_coco.json").read_text())
    assert karpathy["dataset"] == "world"
    assert {image["split"] for image in karpathy["images"]} == {"train", "val", "test", "test_comp"}
    sentence = karpathy["images"][0]["sentences"][0]
    assert sentence["tokens"] == re.findall(r"[a-z]+", sentence["raw"])
    summary = json.loads((world / "world.json").read_text())
    assert summary["counts"]["images"] == {"train": 80, "val": 32, "test": 24, "test_comp": 24}
    assert summary["throughput"]["images_per_second"] > 0
    assert sorted(p.name for p in (world / "shards").iterdir())[:2] == [
        "test-000000.tar",
        "test_comp-000000.tar",
    ]
    assert yaml.safe_load((world / "vocabulary.yaml").read_text()) == world_vocabulary(
        WorldConfig()
    )


def test_shipped_vocabulary_is_the_default_world_vocabulary():
    shipped = Path(__file__).parents[1] / "src" / "lace" / "data" / "world" / "vocabulary.yaml"
    assert yaml.safe_load(shipped.read_text()) == world_vocabulary(WorldConfig())


def test_world_vocabulary_loads_as_a_typed_vocabulary(world):
    vocabulary_module = pytest.importorskip("lace.concepts.vocabulary")
    vocabulary = vocabulary_module.load_vocabulary(world / "vocabulary.yaml")
    assert len(vocabulary) == len(SHAPES) + len(COLOURS) + len(SIZES) + len(TEXTURES) + len(
        RELATIONS
    )
    assert vocabulary.same_type("red", "blue") and not vocabulary.same_type("red", "large")
    assert vocabulary.same_type("left of", "above") and vocabulary.same_type("circle", "star")


def test_coco_captions_name_every_object_and_the_true_relation(world):
    for split in ("train", "test_comp"):
        scenes = {s["index"]: s for s in _scenes(world, split)}
        coco = json.loads((world / "annotations" / f"captions_{split}_coco.json").read_text())
        index_of = {
            image["id"]: int(Path(image["file_name"]).stem.rsplit("_", 1)[1])
            for image in coco["images"]
        }
        for note in coco["annotations"]:
            scene, caption = scenes[index_of[note["image_id"]]], note["caption"]
            phrases = list(NOUN_PHRASE.finditer(caption))
            assert len(phrases) == 2, caption
            by_shape = {o["shape"]: o for o in scene["objects"]}
            named = []
            for match in phrases:
                size, texture, colour, shape = match.groups()
                obj = by_shape[shape]
                assert obj["colour"] == colour, caption
                assert size in (None, obj["size"]) and texture in (None, obj["texture"]), caption
                named.append(obj)
            between = caption[phrases[0].end() : phrases[1].start()].strip()
            between = re.sub(r"^(is|placed) ", "", between)
            assert RELATION_WORDS[between] == _relation(named[0], named[1]), caption


def test_web_captions_are_partial_but_mostly_truthful(world):
    scenes = {s["index"]: s for s in _scenes(world, "train")}
    coco = json.loads((world / "annotations" / "captions_train_web.json").read_text())
    index_of = {
        image["id"]: int(Path(image["file_name"]).stem.rsplit("_", 1)[1])
        for image in coco["images"]
    }
    colour_pairs = wrong = relations = 0
    for note in coco["annotations"]:
        scene, words = scenes[index_of[note["image_id"]]], note["caption"].replace(",", "").split()
        colours = {o["shape"]: o["colour"] for o in scene["objects"]}
        shapes = [w for w in words if w in SHAPES]
        assert shapes and set(shapes) <= set(colours), note["caption"]
        for before, word in itertools.pairwise(words):
            if word in SHAPES and before in COLOURS:
                colour_pairs += 1
                wrong += before != colours[word]
        relations += any(phrase in note["caption"] for phrase in RELATION_WORDS)
    assert colour_pairs > 20 and wrong / colour_pairs < 0.15
    assert 0 < relations < len(coco["annotations"]) * 0.6


def _hue(rgb: np.ndarray) -> np.ndarray:
    """Hue in degrees of (..., 3) RGB."""
    r, g, b = (rgb[..., k].astype(float) for k in range(3))
    high, low = rgb.max(-1).astype(float), rgb.min(-1).astype(float)
    span = np.maximum(high - low, 1e-9)
    hue = np.where(
        high == r, (g - b) / span % 6, np.where(high == g, (b - r) / span + 2, (r - g) / span + 4)
    )
    return hue * 60.0


def _dilate(mask: np.ndarray) -> np.ndarray:
    """Grow a boolean mask by one pixel (8-neighbourhood)."""
    padded = np.pad(mask, 1)
    h, w = mask.shape
    return np.logical_or.reduce(
        [padded[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)]
    )


def _nearest_palette_colour(rgb: np.ndarray) -> np.ndarray:
    names = list(PALETTE)
    hues = _hue(np.array([PALETTE[n] for n in names]))
    gap = np.abs(_hue(rgb)[..., None] - hues)
    gap = np.minimum(gap, 360 - gap)
    return np.array(names)[gap.argmin(-1)]


@pytest.mark.parametrize("size", [32, 64])
def test_pixels_show_each_object_with_its_colour_and_shape(size):
    config = WorldConfig(image_size=size, noise_std=0.0, clutter=0)
    combinations = colour_shape_combinations(config)
    for index in range(25):
        scene = sample_scene(sample_rng(0, "train", index, 0), config, "train", combinations, index)
        pixels = np.asarray(render_scene(scene, config))
        background = np.median(pixels.reshape(-1, 3), axis=0)
        painted = np.abs(pixels.astype(int) - background).max(-1) > 20
        masks = [object_mask(obj, config) for obj in scene["objects"]]
        union = np.logical_or.reduce(masks)
        # Every covered pixel is painted; paint outside the masks is only anti-aliased rim.
        assert (painted & union).sum() >= 0.97 * union.sum()
        assert not (painted & ~_dilate(union)).any()
        for obj, mask in zip(scene["objects"], masks):
            seen = _nearest_palette_colour(pixels[mask])
            assert (seen == obj["colour"]).mean() > 0.9, (obj, index)
            ys, xs = np.nonzero(mask)
            x0, y0, x1, y1 = obj["bbox"]
            assert (
                x0 - 1.5 <= xs.min()
                and xs.max() <= x1 + 1.5
                and y0 - 1.5 <= ys.min()
                and ys.max() <= y1 + 1.5
            )


def _polygon_area(points: list[tuple[float, float]]) -> float:
    xs, ys = np.array(points).T
    return 0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1)))


def test_shape_masks_match_their_outlines_and_differ_from_each_other():
    config = WorldConfig(image_size=64)
    masks = {}
    for shape in SHAPES:
        obj = {"shape": shape, "extent": 24.0, "angle": 0.0, "center": [32.0, 32.0]}
        masks[shape] = object_mask(obj, config)
        expected_area = _polygon_area(OUTLINES[shape]) * (24.0 / 2) ** 2
        assert object_coverage(obj, config).sum() == pytest.approx(expected_area, rel=0.12), (
            shape
        )  # 2x rasterisation
    for a in SHAPES:
        for b in SHAPES:
            if a < b:
                iou = (masks[a] & masks[b]).sum() / (masks[a] | masks[b]).sum()
                assert iou < 0.85, (a, b, iou)


def _words(caption: str) -> list[str]:
    return [w for w in re.findall(r"[a-z]+", caption) if w not in ARTICLES]


def _check_scene_edit(family: str, edit: dict, before: dict, after: dict) -> None:
    a, b = before["objects"], after["objects"]
    changed = {i for i in range(len(a)) if a[i] != b[i]}
    keys = lambda i: {k for k in a[i] if a[i][k] != b[i][k]}
    if family in ("replace_attribute", "replace_object"):
        field = "colour" if family == "replace_attribute" else "shape"
        (i,) = changed
        assert keys(i) == {field} and b[i][field] not in {o[field] for o in a}
        assert after["relations"] == before["relations"]
    elif family in ("swap_attribute", "swap_object"):
        field = "colour" if family == "swap_attribute" else "shape"
        i, j = sorted(changed)
        assert keys(i) == keys(j) == {field}
        assert (b[i][field], b[j][field]) == (a[j][field], a[i][field])
        assert after["relations"] == before["relations"]
    elif family == "swap_relation":
        assert changed == {0, 1} and keys(0) == keys(1) == {"center", "bbox"}
        assert (b[0]["center"], b[1]["center"]) == (a[1]["center"], a[0]["center"])
        assert after["relations"][0]["relation"] != before["relations"][0]["relation"]
    elif family == "replace_relation":
        assert all(keys(i) <= {"center", "bbox"} for i in changed)
        diff = [k for k, r in enumerate(before["relations"]) if r != after["relations"][k]]
        assert diff == [edit["relation"]] and after["relations"][diff[0]]["relation"] == edit["to"]
    for k, stated in enumerate(after["relations"]):  # relations stay true to the new layout
        assert stated["relation"] == _relation(b[stated["subject"]], b[stated["object"]])


def _check_caption_edit(family: str, edit: dict, caption: str, negative: str) -> None:
    words, negative_words = _words(caption), _words(negative)
    assert caption != negative
    if family in ("swap_attribute", "swap_object", "swap_relation"):
        assert sorted(words) == sorted(negative_words)  # same words, bound differently
    if family in ("replace_attribute", "replace_object", "swap_attribute", "swap_object"):
        assert len(words) == len(negative_words)
        diff = [(x, y) for x, y in zip(words, negative_words) if x != y]
        vocabulary = COLOURS if family.endswith("attribute") else SHAPES
        assert all(x in vocabulary and y in vocabulary for x, y in diff)
        if family.startswith("replace"):
            assert diff == [(edit["from"], edit["to"])]
        else:
            assert len(diff) == 2 and diff[0] == diff[1][::-1]
    if family == "replace_relation":
        # Only one relation phrase changes; it names the new relation, or its inverse when the
        # caption states the pair from the other object.
        phrase = "|".join(sorted(RELATION_WORDS, key=len, reverse=True))
        parts, negative_parts = (
            re.split(rf"\b({phrase})\b", caption),
            re.split(rf"\b({phrase})\b", negative),
        )
        assert parts[0::2] == negative_parts[0::2]
        diff = [
            (x, y)
            for x, y in zip(parts[1::2], negative_parts[1::2])
            if RELATION_WORDS[x] != RELATION_WORDS[y]
        ]
        assert len(diff) == 1 and RELATION_WORDS[diff[0][1]] in (
            edit["to"],
            INVERSE_RELATION[edit["to"]],
        )
    if family == "swap_relation":
        phrases, negative_phrases = NOUN_PHRASE.findall(caption), NOUN_PHRASE.findall(negative)
        assert negative_phrases == phrases[::-1]


@pytest.mark.parametrize("n_objects", [1, 2, 3])
def test_each_negative_changes_exactly_the_stated_factor(n_objects):
    config = WorldConfig(image_size=48, objects_per_scene=n_objects)
    combinations = colour_shape_combinations(config)
    seen_families = set()
    for index in range(12):
        scene = sample_scene(sample_rng(0, "test", index, 0), config, "test", combinations, index)
        positive = np.asarray(render_scene(scene, config)).astype(int)
        for item in benchmark_items(scene, sample_rng(0, "test", index, 2), config):
            family, edit, negative_scene = item["family"], item["edit"], item["negative_scene"]
            seen_families.add(family)
            _check_scene_edit(family, edit, scene, negative_scene)
            _check_caption_edit(family, edit, item["caption"], item["negative_caption"])
            negative = np.asarray(render_scene(negative_scene, config)).astype(int)
            moved = [
                i
                for i, (a, b) in enumerate(zip(scene["objects"], negative_scene["objects"]))
                if a != b
            ]
            allowed = np.zeros(positive.shape[:2], bool)
            for i in moved:
                for obj in (scene["objects"][i], negative_scene["objects"][i]):
                    allowed |= object_mask(obj, config)
            allowed = _dilate(allowed)
            differs = (positive != negative).any(-1)
            assert differs.any() and not (differs & ~allowed).any(), family
    expected = {"replace_attribute", "replace_object", "swap_attribute", "swap_object"}
    if n_objects >= 2:
        expected |= {"replace_relation"}
    if n_objects == 2:
        expected |= {"swap_relation"}
    if n_objects == 1:
        expected -= {"swap_attribute", "swap_object"}
    assert seen_families == expected


def test_written_benchmarks_and_winoground_point_at_real_files(world):
    for split in ("val", "test", "test_comp"):
        items = json.loads((world / "benchmarks" / f"{split}.json").read_text())
        scenes = _scenes(world, split)
        assert {i["family"] for i in items} == set(FAMILIES)
        assert len({i["scene_id"] for i in items}) == len(scenes)  # every image has items
        for item in items:
            assert set(item) >= {
                "family",
                "filename",
                "caption",
                "negative_caption",
                "negative_filename",
            }
            assert (world / item["filename"]).is_file() and (
                world / item["negative_filename"]
            ).is_file()
        quads = json.loads((world / "benchmarks" / f"{split}_winoground.json").read_text())
        assert len(quads) == len(scenes)
        for quad in quads:
            assert sorted(_words(quad["caption_0"])) == sorted(_words(quad["caption_1"]))
            assert quad["caption_0"] != quad["caption_1"] and quad["image_0"] != quad["image_1"]
            assert (world / quad["image_1"]).is_file()


def test_held_out_pairs_appear_only_in_test_comp_and_train_is_skewed(world):
    summary = json.loads((world / "world.json").read_text())
    held_out = {tuple(pair) for pair in summary["held_out_pairs"]}
    preferred = summary["preferred_colour"]
    assert len(held_out) == round(0.2 * len(SHAPES) * len(COLOURS))
    assert not held_out & {(colour, shape) for shape, colour in preferred.items()}
    for split in ("train", "val", "test"):
        pairs = {(o["colour"], o["shape"]) for s in _scenes(world, split) for o in s["objects"]}
        assert not pairs & held_out
    for scene in _scenes(world, "test_comp"):
        assert any((o["colour"], o["shape"]) in held_out for o in scene["objects"])
    objects = [o for s in _scenes(world, "train") for o in s["objects"]]
    share = np.mean([preferred[o["shape"]] == o["colour"] for o in objects])
    assert 0.6 < share < 0.8
    uniform = [o for s in _scenes(world, "val") for o in s["objects"]]
    assert np.mean([preferred[o["shape"]] == o["colour"] for o in uniform]) < 0.4


def test_output_reads_back_through_the_dataset_readers(world):
    readers = pytest.importorskip("lace.data.readers")
    coco = readers.read_dataset(world / "annotations" / "captions_val_coco.json")
    karpathy = readers.read_dataset(world / "karpathy_web.json", split="test_comp")
    shards = readers.read_dataset(str(world / "shards" / "train-*.tar"))
    assert len(coco.records) == 32 and len(karpathy.records) == 24 and len(shards.records) == 80
    assert all(Path(r.image_path).is_file() and len(r.captions) == 3 for r in coco.records)
    assert all(Path(r.image_path).is_file() for r in karpathy.records)
    web = json.loads((world / "annotations" / "captions_train_web.json").read_text())
    first_captions = [
        a["caption"] for a in web["annotations"] if a["image_id"] == web["images"][0]["id"]
    ]
    assert list(shards.records[0].captions) == first_captions


def test_caption_styles_and_bad_input():
    config = WorldConfig(image_size=32)
    scene = sample_scene(sample_rng(0, "train", 0, 0), config, "train")
    assert NOUN_PHRASE.search(caption_scene(scene, np.random.default_rng(0), "coco", config))
    with pytest.raises(LaceInputError, match="style"):
        caption_scene(scene, np.random.default_rng(0), "poetry", config)
    with pytest.raises(LaceInputError, match="objects_per_scene"):
        WorldConfig(objects_per_scene=5)
    with pytest.raises(LaceInputError, match="colours"):
        WorldConfig(colours=("red", "mauve"))
    with pytest.raises(LaceInputError, match="split_fractions"):
        WorldConfig(split_fractions=(0.5, 0.5, 0.5, 0.0))
    assert set(RELATIONS) == set(RELATION_WORDS.values())


@pytest.mark.slow
def test_cli_writes_a_world_and_refuses_to_clobber(tmp_path, capsys):
    from lace.cli import main

    out = tmp_path / "world"
    settings = tmp_path / "world.yaml"
    settings.write_text("cooccurrence_skew: 0.9\nrelations: [left of, right of]\n")
    args = [
        "world",
        "--out",
        str(out),
        "--n",
        "40",
        "--size",
        "32",
        "--no-progress",
        "--config",
        str(settings),
    ]
    assert main(args + ["--preview", "--seed", "3"]) == 0
    assert "images/s" in capsys.readouterr().out
    assert (out / "preview.png").is_file()
    written = json.loads((out / "world.json").read_text())
    assert written["config"]["cooccurrence_skew"] == 0.9 and written["seed"] == 3
    relations = {r["relation"] for s in _scenes(out, "train") for r in s["relations"]}
    assert relations <= {"left of", "right of"}
    assert main(args) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(args + ["--overwrite", "--objects", "3"]) == 0
    assert len(_scenes(out, "train")[0]["objects"]) == 3


def test_one_reader_of_world_files_names_the_file_and_the_field(tmp_path):
    import json

    from lace.data.world.folder import read_scenes, read_world_config
    from lace.errors import LaceInputError

    with pytest.raises(LaceInputError, match="lace world --out"):
        read_world_config(tmp_path)
    (tmp_path / "world.json").write_text(json.dumps({"config": {"n_images": "many"}}))
    with pytest.raises(LaceInputError, match=r"world\.json: field 'n_images'"):
        read_world_config(tmp_path)
    (tmp_path / "scenes_val.jsonl").write_text('{"id": "val_0", "objects": []}\n{"id": "val_1"}\n')
    with pytest.raises(LaceInputError, match=r"scenes_val\.jsonl:2: field 'objects'"):
        read_scenes(tmp_path, "val")
