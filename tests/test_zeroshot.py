"""Zero-shot classification: CLIP_benchmark's scoring, image-folder tasks, the world's tasks, the CLI."""

import json
import logging
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import balanced_accuracy_score

from lace.cli import main
from lace.data.world import WorldConfig, generate_world
from lace.data.world.folder import read_world_config
from lace.data.world.zeroshot import ensure_zeroshot_tasks, zeroshot_scenes
from lace.errors import LaceInputError
from lace.eval.benchmarks import get_benchmark
from lace.eval.benchmarks.zeroshot import class_embeddings
from lace.eval.embedding_cache import EmbeddingCache
from lace.eval.metrics import zeroshot_scores
from lace.experiment.zeroshot import world_zeroshot_root
from lace.io import read_json
from tests.test_benchmark_readers import BLUE, GREEN, RED, ColourEncoder, save_png


def test_zeroshot_scores_match_a_direct_count_and_scikit_learn():
    rng = np.random.default_rng(0)
    scores, labels = rng.normal(size=(200, 7)), rng.integers(0, 6, size=200)  # class 6 never occurs
    figures = zeroshot_scores(scores, labels)
    labels_present = np.unique(labels)
    ranked = np.argsort(-scores, axis=1)
    assert figures["top1"] == pytest.approx(np.mean(ranked[:, 0] == labels))
    assert figures["top5"] == pytest.approx(np.mean([label in row[:5] for label, row in zip(labels, ranked)]))
    recalls = [np.mean(ranked[labels == c, 0] == c) for c in labels_present]
    assert figures["mean_per_class_recall"] == pytest.approx(np.mean(recalls))
    with warnings.catch_warnings():  # scikit-learn agrees (and warns that class 6 is predicted but absent)
        warnings.simplefilter("ignore")
        assert figures["mean_per_class_recall"] == pytest.approx(balanced_accuracy_score(labels, ranked[:, 0]))
    assert np.isnan(zeroshot_scores(scores[:, :4], labels % 4)["top5"])  # fewer than five classes


def make_folder(root, layout: dict[str, list[tuple]]):
    for folder, colours in layout.items():
        for k, colour in enumerate(colours):
            save_png(root / folder / f"{k}.png", colour)
    return root


COLOUR_PROMPTS = {"a photo of a red.": RED, "a photo of a green.": GREEN, "a photo of a light blue.": BLUE}


def test_an_image_folder_is_classified_by_its_prompts(tmp_path):
    root = make_folder(tmp_path / "colours", {
        "red": [(255, 0, 0), (200, 0, 0)], "green": [(0, 255, 0)], "light_blue": [(0, 0, 255), (255, 0, 0)]})
    benchmark = get_benchmark("zeroshot")
    data = benchmark.load(root)
    task = data["colours"]
    assert task.classnames == ["green", "light blue", "red"]  # sorted folders, "_" read as a space
    assert task.labels == [0, 1, 1, 2, 2] and task.templates == ["a photo of a {c}."]
    figures = benchmark.evaluate(ColourEncoder(COLOUR_PROMPTS), data)
    # the red image in light_blue/ is predicted red: 4 of 5 right; light blue recalls 1 of 2
    assert figures["colours/top1"] == pytest.approx(4 / 5)
    assert figures["colours/mean_per_class_recall"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert np.isnan(figures["colours/top5"])


def test_class_names_and_templates_files_in_the_formats_clip_benchmark_uses(tmp_path):
    root = make_folder(tmp_path / "colours", {"c0": [(255, 0, 0)], "c1": [(0, 255, 0)]})
    for name, content in (("list.json", ["red", "green"]), ("map.json", {"c1": "green", "c0": "red"}),
                          ("bench.json", {"colours": ["red", "green"], "other": ["x", "y"]})):
        (tmp_path / name).write_text(json.dumps(content))
        assert get_benchmark("zeroshot").load(root, classnames=tmp_path / name)["colours"].classnames == ["red", "green"]
    (tmp_path / "names.txt").write_text("red\ngreen\n")
    (tmp_path / "templates.json").write_text(json.dumps({"default": ["a {c} thing.", "the {c} one."]}))
    task = get_benchmark("zeroshot").load(root, classnames=tmp_path / "names.txt",
                                          templates=tmp_path / "templates.json")["colours"]
    assert task.classnames == ["red", "green"] and task.templates == ["a {c} thing.", "the {c} one."]
    # each class is the renormalised mean of its prompts' unit embeddings
    cache = EmbeddingCache(ColourEncoder({"a red thing.": RED, "the red one.": GREEN}))
    expected = F.normalize(torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), dim=-1)
    torch.testing.assert_close(class_embeddings(cache, task.classnames, task.templates), expected)


def test_bad_zero_shot_inputs_are_named(tmp_path):
    root = make_folder(tmp_path / "one", {"only": [(255, 0, 0)]})
    with pytest.raises(LaceInputError, match="at least two class subfolders"):
        get_benchmark("zeroshot").load(root)
    make_folder(root, {"other": [(0, 255, 0)]})
    (tmp_path / "t.json").write_text(json.dumps(["a photo"]))
    with pytest.raises(LaceInputError, match="t.json.*'{c}'"):
        get_benchmark("zeroshot").load(root, templates=tmp_path / "t.json")
    (tmp_path / "n.json").write_text(json.dumps(["just one"]))
    with pytest.raises(LaceInputError, match="n.json: expected 2 class names"):
        get_benchmark("zeroshot").load(root, classnames=tmp_path / "n.json")
    with pytest.raises(LaceInputError, match="folder not found"):
        get_benchmark("zeroshot").load(tmp_path / "missing")


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("world")
    config = WorldConfig(n_images=20, image_size=32, split_fractions=(0.5, 0.1, 0.3, 0.1),
                         benchmark_items_per_family=1, coco_captions=1)
    generate_world(config, folder, overwrite=True, progress=False)
    return folder


def test_world_tasks_show_what_their_class_says_and_are_written_once(tiny_world):
    config = read_world_config(tiny_world)
    for task, read in (("shape", lambda s: s["objects"][0]["shape"]), ("colour", lambda s: s["objects"][0]["colour"]),
                       ("count", lambda s: ["one shape", "two shapes", "three shapes", "four shapes"][
                           len(s["objects"]) - 1])):
        scenes = zeroshot_scenes(config, task, 2)
        assert all(read(scene) == name and len(found) == 2 for name, found in scenes.items() for scene in found)
    assert list(zeroshot_scenes(config, "count", 1)) == ["one shape", "two shapes", "three shapes", "four shapes"]
    assert set(zeroshot_scenes(config, "shape", 1)) == set(config.shapes)
    out = ensure_zeroshot_tasks(tiny_world, per_class=2)
    first = (out / "shape" / "circle" / "0000.png").read_bytes()
    stamp = (out / "tasks.json").stat().st_mtime_ns
    assert ensure_zeroshot_tasks(tiny_world, per_class=2) == out
    assert (out / "tasks.json").stat().st_mtime_ns == stamp  # nothing rewritten
    data = get_benchmark("zeroshot").load(tiny_world, per_class=2)
    assert set(data) == {"shape", "colour", "count"}
    assert len(data["shape"].image_paths) == 2 * len(config.shapes)
    assert data["colour"].classnames == sorted(config.colours)  # folder order, as ImageFolder
    assert data["count"].classnames == ["one shape", "two shapes", "three shapes", "four shapes"]
    assert data["count"].templates == ["{c}.", "a photo of {c}."]
    assert (out / "shape" / "circle" / "0000.png").read_bytes() == first  # same world, same pixels


def test_lace_eval_zeroshot_on_a_world_and_on_a_folder(tiny_world, tmp_path):
    folder = make_folder(tmp_path / "colours", {"red": [(255, 0, 0)], "green": [(0, 255, 0)]})
    torch.manual_seed(0)
    assert main(["eval", "--model", "lace-micro-32", "--pretrained", "none", "--device", "cpu",
                 "--benchmarks", "zeroshot", "--world", str(tiny_world), "--zeroshot-per-class", "2",
                 "--no-diagnostics", "--out", str(tmp_path / "world.json"), "--no-progress"]) == 0
    figures = json.loads((tmp_path / "world.json").read_text())["benchmarks"]["zeroshot"]
    assert {f"{task}/{key}" for task in ("shape", "colour", "count")
            for key in ("top1", "top5", "mean_per_class_recall")} == set(figures)
    assert 0.0 <= figures["shape/top1"] <= figures["shape/top5"] <= 1.0
    assert figures["count/top5"] is None  # four classes: no top-5
    assert main(["eval", "--model", "lace-micro-32", "--pretrained", "none", "--device", "cpu",
                 "--benchmarks", "zeroshot", "--zeroshot-root", str(folder), "--no-diagnostics",
                 "--out", str(tmp_path / "folder.json"), "--no-progress"]) == 0
    assert "colours/top1" in json.loads((tmp_path / "folder.json").read_text())["benchmarks"]["zeroshot"]


def test_a_stopped_write_of_the_world_tasks_does_not_block_the_next(tiny_world, tmp_path, monkeypatch):
    from lace.data.world import zeroshot

    folder = tmp_path / "run_zeroshot"
    calls = {"n": 0}
    render = zeroshot.render_scene

    def stopped_midway(scene, config):
        calls["n"] += 1
        if calls["n"] > 5:  # a few images written, then the run is stopped
            raise KeyboardInterrupt
        return render(scene, config)

    monkeypatch.setattr(zeroshot, "render_scene", stopped_midway)
    with pytest.raises(KeyboardInterrupt):
        world_zeroshot_root(tiny_world, folder, per_class=2)
    assert not (folder / "zeroshot").exists()  # no half-written task folder
    monkeypatch.setattr(zeroshot, "render_scene", render)
    (folder / ".zeroshot.tmp" / "shape").mkdir(parents=True)  # what a killed process leaves
    out = ensure_zeroshot_tasks(folder, per_class=2)
    assert read_json(out / "tasks.json")["per_class"] == 2 and not (folder / ".zeroshot.tmp").exists()
    written = sorted(p.relative_to(out) for p in out.rglob("*.png"))
    # tasks an older lace wrote in place and did not finish are replaced, not refused
    (out / "tasks.json").unlink()
    (out / "shape" / "circle" / "0000.png").write_bytes(b"half")
    assert ensure_zeroshot_tasks(folder, per_class=2) == out
    assert sorted(p.relative_to(out) for p in out.rglob("*.png")) == written
    assert (out / "shape" / "circle" / "0000.png").read_bytes() != b"half"
    # a folder holding something else is never removed
    (out / "tasks.json").unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(LaceInputError, match="not zero-shot tasks"):
        ensure_zeroshot_tasks(folder, per_class=2)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_run_s_zero_shot_folder_has_a_manifest_for_its_world_copy(tiny_world, tmp_path, caplog):
    folder = world_zeroshot_root(tiny_world, tmp_path / "zeroshot", per_class=1)
    with caplog.at_level(logging.WARNING, logger="lace.manifest"):
        assert read_world_config(folder) == read_world_config(tiny_world)
    assert "manifest" not in caplog.text
    assert "world.json" in read_json(folder / "manifest.json")["files"]
    # a folder written before the manifest (an older lace) gets one when the run is reused
    (folder / "manifest.json").unlink()
    world_zeroshot_root(tiny_world, folder, per_class=1)
    assert "world.json" in read_json(folder / "manifest.json")["files"]
    # and the manifest is checked: a damaged copy is named
    (folder / "world.json").write_bytes((folder / "world.json").read_bytes() + b" ")
    with pytest.raises(LaceInputError, match="world.json: damaged"):
        read_world_config(folder)
