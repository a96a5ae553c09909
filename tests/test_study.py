"""`lace study flickr8k` end to end on a tiny synthetic Flickr-like folder (real towers, tiny heads)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from lace.cli import main
from lace.errors import LaceInputError
from lace.experiment.dictionary import DictionaryConfig
from lace.study import HeadsTraining, StudyConfig, run_flickr8k_study
from lace.study.config import STUDY_VARIANTS as VARIANTS
from lace.study.flickr8k import prepare_study_folder
from lace.study.report import plain_statement
from lace.train.data import caption_rows_by_image
from tests.test_demo import check_grid_in_report

SCENES = [
    ("grass", (40, 160, 40), ["a {a} dog runs on the grass", "a dog plays in the green grass",
                             "a man and a dog on the grass", "a brown dog on a field of grass",
                             "the dog jumps over the grass"]),
    ("snow", (235, 235, 245), ["a woman walks in the snow", "a man skis down the white snow",
                               "a {a} dog runs through the snow", "two people stand in the snow",
                               "a child plays in deep snow"]),
    ("beach", (230, 200, 120), ["a man in a red shirt stands on the beach", "a woman runs on the beach",
                                "a dog on the sandy beach near the water", "children play on the beach",
                                "a man sits on the beach by the water"]),
    ("horse", (120, 70, 30), ["a brown horse stands in a field", "a woman rides a horse",
                              "a man next to a {a} horse", "a horse runs on the grass", "a black horse and a dog"]),
]
COLOURS = ["black", "white", "brown", "red"]


def make_folder(root, n_images=40):
    images = root / "images"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = ["image,caption"]
    for i in range(n_images):
        _, colour, captions = SCENES[i % len(SCENES)]
        pixels = np.clip(np.array(colour) + rng.normal(0, 25, (48, 64, 3)), 0, 255).astype(np.uint8)
        pixels[10:30, 10 + i % 20: 30 + i % 20] = rng.integers(0, 255, 3)
        name = f"photo_{i:03d}.jpg"
        Image.fromarray(pixels).save(images / name, quality=90)
        rows += [f"{name},{c.format(a=COLOURS[i % len(COLOURS)])} ." for c in captions]
    (root / "captions.csv").write_text("\n".join(rows) + "\n")
    return root


def make_classes(root):
    """A zero-shot image folder: two classes (grass, snow) of two images each."""
    for name, colour, _ in SCENES[:2]:
        (root / name).mkdir(parents=True)
        for k in range(2):
            Image.fromarray(np.full((48, 64, 3), colour, dtype=np.uint8)).save(root / name / f"{k}.jpg")
    return root


def tiny_config(data, out, cache):
    # The tiny world's base heads train unclipped: clipped, their 3 epochs leave no atom aligned
    # with "snow", and the transplant figures would go untested. The fine-tunes clip as by default.
    heads = HeadsTraining(hidden_dim=32, dropout=0.1, embed_dim=16, lr=3e-3, epochs=3, batch_size=8, warmup_steps=1,
                          grad_clip_norm=None)
    return StudyConfig(
        data=str(data), out=str(out), feature_cache=str(cache), seeds=2,
        base_grid=(heads, HeadsTraining(hidden_dim=0, dropout=0.0, embed_dim=16, lr=3e-3, epochs=3, batch_size=8,
                                        warmup_steps=1, grad_clip_norm=None)),
        finetune=HeadsTraining(epochs=1, lr=1e-3, batch_size=8, warmup_steps=1),
        dictionary=DictionaryConfig(atoms=16, sparsity=3, max_seconds=10, tau_align=0.3, calibration="covariance", bindings=False), rule_brittleness_captions=20, items_per_kind=8,
        concepts_shown=3, transplants=(("grass", "snow"), ("dog", "horse")), strengths=(1.0, 4.0),
        image_batch_size=16, num_workers=0, progress=False, zeroshot_min_images=1,
    )


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("flickr")
    data = make_folder(root / "data")
    config = replace(tiny_config(data, root / "study", root / "cache"), zeroshot_root=str(make_classes(root / "classes")))
    results = run_flickr8k_study(config, log=lambda _: None)
    return config, results, root


@pytest.mark.slow
def test_every_stage_ran_and_is_recorded(study):
    _, results, _ = study
    assert results["data"] == {"train": {"images": 30, "captions": 150}, "val": {"images": 5, "captions": 25},
                               "test": {"images": 5, "captions": 25}}
    assert results["throughput"]["computed_in_this_run"] is True
    assert results["throughput"]["images_per_second"] > 0 and results["throughput"]["captions_per_second"] > 0
    assert len(results["base"]["grid"]) == 2 and results["base"]["chosen"] in (0, 1)
    chosen = results["base"]["grid"][results["base"]["chosen"]]
    assert chosen["val_mean_R@1"] == max(row["val_mean_R@1"] for row in results["base"]["grid"])
    assert set(results["finetunes"]) == set(VARIANTS)
    assert all(len(runs) == 2 for runs in results["finetunes"].values())
    for name in ("base", "dictionary", "base-geometry", "edit-retrieval"):
        assert name in results["wall_seconds"]
    figures = results["base_figures"]
    for key in ("i2t/R@1", "t2i/R@10", "hubness/i2t/skewness", "isotropic/one_way/image", "brittleness/rule/all",
                "brittleness/counterfactual/all", "sugarcrepe_style/mean"):
        assert key in figures
    assert 0.0 <= figures["i2t/R@1"] <= 1.0
    assert len(figures["nk/i2t"]) == 25 and sum(figures["nk/i2t"]) == 5 * 10  # 5 image queries x top 10
    assert results["bank"]["train_negatives"] > 0 and results["bank"]["items"] > 0


@pytest.mark.slow
def test_switches_change_training_but_not_the_data_order(study):
    _, results, _ = study
    finetunes = results["finetunes"]
    plain, lace = finetunes["plain"][0]["train"], finetunes["LACE"][0]["train"]
    assert plain["steps"] == lace["steps"]
    assert plain["caption_negative_rows"] == 0 and plain["image_negative_rows"] == 0
    assert finetunes["caption negatives"][0]["train"]["caption_negative_rows"] > 0
    assert finetunes["caption negatives"][0]["train"]["image_negative_rows"] == 0
    assert finetunes["LACE images only"][0]["train"]["caption_negative_rows"] == 0
    # seeds give different runs
    a, b = (run["figures"]["nk/i2t"] for run in finetunes["plain"])
    assert finetunes["plain"][0]["train"]["final_loss"] != finetunes["plain"][1]["train"]["final_loss"] or a != b


@pytest.mark.slow
def test_report_holds_every_table_and_figure_with_numbers_from_results(study):
    _, _, root = study
    out = root / "study"
    markdown = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for heading in ("1. Tower features", "2. Base heads", "3. Geometry of the base", "4. Concept dictionary",
                    "5. Edit retrieval", "6. Fine-tunes", "7. What LACE changed"):
        assert heading in markdown and heading in html
    for figure in ("edit_retrieval.png", "finetune_retrieval.png", "finetune_composition.png", "nk_i2t.png",
                   "atom_top_images.png", "transplant_atoms.png", "transplant_neighbours.png"):
        assert (out / "figures" / figure).is_file() and f"figures/{figure}" in markdown
    assert html.count("data:image/png;base64,") >= 7
    saved = json.loads((out / "results.json").read_text())
    assert f"{saved['base_figures']['i2t/R@5']:.3f}" in markdown
    plain = saved["summary"]["plain"]["t2i/R@1"]
    assert f"{plain['mean']:.3f} ± {plain['std']:.3f}" in markdown
    rows = saved["edit_retrieval"]["rows"]
    assert len(rows) == 4 and {r["strength"] for r in rows} == {1.0, 4.0}
    done = [r for r in rows if "transplant/target" in r]
    assert done, rows
    for row in done:
        assert 0.0 <= row["transplant/target"] <= 1.0 and 0.0 <= row["random/target"] <= 1.0
        assert f"{row['transplant/target']:.3f}" in markdown
    for variant in VARIANTS:
        assert re.search(rf"\| {re.escape(variant)} \|", markdown)


@pytest.mark.slow
def test_report_has_zeroshot_before_and_after_every_fine_tune_and_the_edit_grid(study):
    _, _, root = study
    out = root / "study"
    markdown = (out / "report.md").read_text()
    saved = json.loads((out / "results.json").read_text())
    task = saved["zeroshot_task"]
    # beach, snow and horse scenes: one object named by every caption, the others by one caption at most
    assert len(task["classes"]) >= 2 and set(task["classes"]) <= {"beach", "snow", "horse"}
    assert task["images"] == sum(task["images_per_class"].values())
    section = markdown.split("Zero-shot classification before and after every fine-tune")[1].split("\n## ")[0]
    models = {"base": saved["base_figures"]}
    models.update({f"{v} seed {s}": run["figures"] for v, runs in saved["finetunes"].items() for s, run in enumerate(runs)})
    for model, figures in models.items():
        top1 = figures["zeroshot/captions/top1"]
        assert 0.0 <= top1 <= 1.0 and figures["zeroshot/captions/top5"] is None  # under five classes: no top-5
        # the --zeroshot-root folder, through the towers and this model's heads: four images, two classes
        assert figures["zeroshot/classes/top1"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        row = next(line for line in section.splitlines() if line.startswith(f"| {model} | "))
        assert row.startswith(f"| {model} | {top1:.3f} | {figures['zeroshot/classes/top1']:.3f} |")
    # the grass->snow grid over the test images, its counts in the report
    grid = saved["edit_grids"]["transplant:grass=snow"]
    if "skipped" in grid or grid["figure"] is None:
        assert "grass=snow" in markdown and ("skipped" in markdown or "could not be made" in markdown)
    else:
        check_grid_in_report(grid, markdown, min_sources=1)  # five test images: one names grass and not snow
        assert (out / "figures" / grid["figure"]).is_file()
    # every fine-tune is saved as a heads checkpoint that `lace eval`'s loader reads
    from lace.encoders import load_encoder

    base = load_encoder("lace-towers", str(out / saved["base"]["checkpoint"])).image_head.state_dict()
    checkpoints = set()
    for runs in saved["finetunes"].values():
        for run in runs:
            checkpoints.add(run["checkpoint"])
            heads = load_encoder("lace-towers", str(out / run["checkpoint"])).image_head.state_dict()
            assert heads.keys() == base.keys() and any(not torch.equal(heads[k], base[k]) for k in base)
    assert len(checkpoints) == sum(len(runs) for runs in saved["finetunes"].values())


@pytest.mark.slow
def test_rerun_reuses_every_stage(study):
    config, results, _ = study
    again = run_flickr8k_study(config, log=lambda _: None)
    assert all(again["reused_stages"].values()) and len(again["reused_stages"]) >= 4 + 2 * len(VARIANTS)
    assert again["summary"] == results["summary"]
    assert again["throughput"]["computed_in_this_run"] is False


@pytest.mark.slow  # the study fixture: the whole tiny study, every variant and seed
def test_the_editors_n_edits_reaches_every_fine_tune_and_the_measures(study, tmp_path, monkeypatch):
    """`--edit-n-edits` sets `StudyConfig.edit.n_edits`, the one M of the study: the fine-tunes train with it and
    counterfactual brittleness measures with it (it once keyed the stages but left training at 4)."""
    import shutil

    import lace.study.flickr8k as study_module
    import lace.study.heads as heads_module
    from lace.edits import EditConfig

    config, _, root = study
    shutil.copytree(root / "study", tmp_path / "study")  # the fixture's stages (features, base, dictionary) reused
    trained, measured = [], []
    real_train, real_measure = heads_module.train, study_module.measure_model
    monkeypatch.setattr(heads_module, "train", lambda train_config, **inputs: trained.append(
        train_config.negatives.edit.n_edits) or real_train(train_config, **inputs))
    monkeypatch.setattr(study_module, "measure_model", lambda *args, **kwargs: measured.append(args[6]) or real_measure(
        *args, **kwargs))
    run_flickr8k_study(replace(config, out=str(tmp_path / "study"), variants=("LACE",), seeds=1,
                               edit=EditConfig(n_edits=2)), log=lambda _: None)
    assert trained == [2] and measured and set(measured) == {2}


def test_the_old_n_edits_key_still_sets_the_editors_m():
    from lace.config import config_from_dict

    config = config_from_dict(StudyConfig, {"data": "d", "out": "o", "n_edits": 3})
    assert config.edit.n_edits == 3 and not hasattr(config, "n_edits")


def test_foreign_folder_is_refused_and_cli_needs_data(tmp_path, monkeypatch):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(LaceInputError, match="no earlier study"):
        prepare_study_folder(tmp_path / "other", overwrite=False)
    monkeypatch.delenv("LACE_FLICKR8K", raising=False)
    assert main(["study", "flickr8k", "--out", str(tmp_path / "new")]) == 2


def test_caption_rows_by_image_groups_rows():
    groups = caption_rows_by_image(np.array([1, 0, 1, 2, 0]), 3)
    assert [g.tolist() for g in groups] == [[1, 4], [0, 2], [3]]


def test_plain_statement_decides_only_beyond_the_seeds_interval():
    def runs(*values):
        return [{"figures": {"i2t/R@1": value, "hubness/i2t/skewness": 1.0 - value}} for value in values]

    finetunes = {"plain": runs(0.29, 0.30, 0.31), "LACE": runs(0.30, 0.315, 0.30),
                 "rule negatives": runs(0.20, 0.21, 0.19), "one seed": runs(0.40)}
    lines = plain_statement(finetunes)
    assert "i2t/R@1 0.305 vs 0.300 (+0.005, not decided, n = 3 runs)" in lines[0]
    assert "i2t/R@1 0.200 vs 0.300 (-0.100, worse)" in lines[1]
    assert "hubness/i2t/skewness 0.800 vs 0.700 (+0.100, worse)" in lines[1]  # lower is better
    assert "(+0.100, not decided, n = 1 run)" in lines[2]  # one seed against three: no interval
    assert plain_statement({"LACE": runs(0.3)}) == ["No plain fine-tune was run, so nothing is compared."]


def test_sugarcrepe_style_items_change_one_thing_and_are_deterministic():
    from lace.concepts.vocabulary import load_vocabulary
    from lace.edits.captions import RuleNegatives
    from lace.study.measure import SUGARCREPE_KINDS, sugarcrepe_style_items

    rules = RuleNegatives(load_vocabulary("natural"))
    captions = ["a black dog runs on the grass next to a white horse", "a man in a red shirt stands on the beach",
                "a woman walks in the snow", "two dogs play with a ball"]
    owner = np.array([0, 0, 1, 1])
    items = sugarcrepe_style_items(rules, captions, owner, per_kind=2)
    assert items == sugarcrepe_style_items(rules, captions, owner, per_kind=2)
    assert {item["kind"] for item in items} <= set(SUGARCREPE_KINDS) and "replace_obj" in {i["kind"] for i in items}
    for kind in SUGARCREPE_KINDS:
        assert sum(item["kind"] == kind for item in items) <= 2
    for item in items:
        assert item["negative_caption"] != item["caption"] and item["image"] == owner[item["caption_row"]]


def test_score_items_counts_strict_wins_per_kind():
    from lace.study.measure import item_correct, score_items

    images = torch.eye(3)[:2]  # (2, 3)
    texts = torch.eye(3)[:2]
    negatives = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # one tie for image 1
    items = [{"kind": "swap_obj", "image": 0, "caption_row": 0}, {"kind": "swap_obj", "image": 1, "caption_row": 1},
             {"kind": "replace_att", "image": 1, "caption_row": 1}]
    figures = score_items(images, texts, negatives, items)
    assert figures["swap_obj"] == 1.0 and figures["replace_att"] == 0.0 and figures["mean"] == 0.5
    # the same wins item by item, kept for the intervals over items
    correct = item_correct(images, texts, negatives, items)
    assert {kind: right.tolist() for kind, right in correct.items()} == {"swap_obj": [True, True],
                                                                         "replace_att": [False]}


def test_caption_derived_zeroshot_task_and_its_measurement():
    from types import SimpleNamespace

    from lace.concepts.vocabulary import load_vocabulary
    from lace.eval.measure import MeasureConfig, MeasuredSplit, measure
    from lace.study.zeroshot import caption_task

    captions = ["a dog on the grass", "a dog runs", "a horse", "a brown horse", "a dog", "a dog and a horse",
                "a dog", "a black dog", "nothing here"]
    split = SimpleNamespace(captions=captions, caption_image_index=[0, 0, 1, 1, 2, 3, 4, 4, 5],
                            image_paths=[f"{i}.jpg" for i in range(6)])
    task = caption_task(load_vocabulary("natural"), split, min_images=1)
    # image 0: dog in both captions, grass in one of two; image 3 names dog and horse, image 5 nothing: left out
    assert task.classes == ["dog", "horse"] and task.image_rows.tolist() == [0, 1, 2, 4]
    assert task.labels.tolist() == [0, 1, 0, 0]
    assert caption_task(load_vocabulary("natural"), split, min_images=2).classes == ["dog"]
    images = torch.nn.functional.normalize(torch.tensor(
        [[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0], [0.0, 1.0], [1.0, 1.0]]), dim=1)
    classes = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # dog, horse
    figures = measure(MeasuredSplit(images, images, list(range(6))), MeasureConfig(("zeroshot",)),
                      zeroshot_task=task, zeroshot_classes=classes)
    # images 0, 2 (dog) and 1 (horse) right; image 4 (dog) -> horse: wrong
    assert figures["zeroshot/captions/top1"] == pytest.approx(3 / 4)
    assert figures["zeroshot/captions/mean_per_class_recall"] == pytest.approx((2 / 3 + 1) / 2)
    assert figures["zeroshot/captions/top5"] is None
