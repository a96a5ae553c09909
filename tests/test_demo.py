"""A reduced demo end to end: every table and plot present, every number from results.json."""

import json
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest

from lace.config import with_changes
from lace.demo import DemoConfig, run_demo
from lace.demo.config import DEMO_DICTIONARY, DEMO_FINETUNE
from lace.demo.sweep import read_grid, reuse_run, run_sweep, setting_folder
from lace.demo.targets import BINDING_TARGETS, CLAIMS, STORY, binding_targets, claims
from lace.errors import LaceInputError
from lace.experiment.protocol import Run
from lace.experiment.variants import CHOSEN_BEST, with_caption_negatives

BEST_WITH_CAPTIONS = with_caption_negatives(CHOSEN_BEST)
DEFAULT_ARMS = ("plain", "caption negatives", "LACE", CHOSEN_BEST, BEST_WITH_CAPTIONS)
# One thread, every stage in this process (the stages side by side in worker processes are
# test_demo_parallel's); the local editors fitted on 60 images, as in test_demo_local_editor (they still edit: checked).
TINY = DemoConfig(world_images=240, base_steps=6, batch_size=16, threads=1,
                  dictionary=replace(DEMO_DICTIONARY, atoms=16, sparsity=3),
                  finetune=with_changes(DEMO_FINETUNE, {"steps": 3, "n_edits": 2, "local": {"fit_images": 60}}),
                  progress=False)


def _numbers(value, found: set[str]) -> set[str]:
    if isinstance(value, dict):
        for item in value.values():
            _numbers(item, found)
    elif isinstance(value, list):
        for item in value:
            _numbers(item, found)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        found.add(str(value))
    elif isinstance(value, float):
        found.update({f"{value:.3f}", f"{value:.1f}"})
    return found


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    summary = run_demo(TINY, out, log=lambda _: None)
    return out, summary


@pytest.mark.slow
def test_report_has_every_table_and_plot(demo):
    out, summary = demo
    report = (out / "report.md").read_text()
    for heading in ("Summary", "What improved and what did not", "Calibration of the base", "Binding, in-distribution test",
                    "Binding, compositional test", "Retrieval and geometry", "The concept dictionary",
                    "Edit retrieval", "Time per stage", "Configuration and seeds"):
        assert f"## {heading}" in report, heading
    for figure in ("figures/ablation.png", "figures/nk_histograms.png"):
        assert f"]({figure})" in report and (out / figure).stat().st_size > 1000
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 2
    for variant in ("base", *DEFAULT_ARMS):
        assert f"| {variant} |" in report
    assert set(summary["evaluations"]) == {"base"} | {f"{arm} seed 0" for arm in DEFAULT_ARMS}
    # each run carried as a record beside its label, its model and run folder named by it
    assert summary["runs"][f"{BEST_WITH_CAPTIONS} seed 0"] == {
        "arm": BEST_WITH_CAPTIONS, "seed": 0,
        "folder": "LACE-local-symmetric-pairs-round-trip-plus-caption-negatives-seed0"}
    assert set(summary["runs"]) == set(summary["evaluations"]) - {"base"}
    for record in summary["runs"].values():
        assert (out / "models" / f"finetune-{record['folder']}.pt").is_file()
        assert (out / "runs" / record["folder"] / "metrics.jsonl").is_file()
    # the local arms trained with edits from the one editor they share
    for arm in (CHOSEN_BEST, BEST_WITH_CAPTIONS):
        stage = json.loads((out / "stages" / f"{Run(arm, 0).stage('finetune')}.json").read_text())
        assert stage["result"]["last_metrics"]["image_negatives_valid_rows"] > 0, arm
    # every stage's CPU time beside its wall time, and how busy the machine was
    assert set(summary["cpu_seconds"]) == set(summary["wall_seconds"])
    assert all(seconds > 0 for seconds in summary["cpu_seconds"].values())
    assert len(summary["machine"]["load_average_at_start"]) == 3 and "load average" in report
    # the base's evaluation runs beside the fine-tunes, as does reading and decoding what every evaluation shares
    # (in this process, before the first evaluation: a step of its own in the table, just before it)
    assert summary["machine"]["parent_stages"] == ["world", "base", "dictionary", "edit_retrieval", "zeroshot base"]
    stages = list(summary["cpu_seconds"])
    assert stages.index("prepare evaluations") + 1 == stages.index("eval base") and "| prepare evaluations |" in report
    assert "estimated wall time on a quiet machine" in report
    # two arms edit images, but the default demo, kept short, runs no provenance stage (--full does)
    assert "provenance" not in summary and "## Provenance" not in report
    assert not any(name.startswith("provenance") for name in summary["wall_seconds"])


@pytest.mark.slow
def test_every_number_in_the_report_tables_comes_from_results(demo):
    out, _ = demo
    results = json.loads((out / "results.json").read_text())
    known = _numbers(results, set())
    cells = []
    for line in (out / "report.md").read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells += [cell.strip() for cell in line.strip("|").split("|")]
    numeric = [cell for cell in cells if re.fullmatch(r"-?\d+(\.\d+)?", cell)]
    assert len(numeric) > 50
    assert [cell for cell in numeric if cell not in known] == []


@pytest.mark.slow
def test_claims_are_checked_against_the_numbers(demo):
    _, summary = demo
    rules = {"by >= 15 points": lambda d: d >= 0.15, "within 2 points": lambda d: d >= -0.02,
             "lowers": lambda d: d < 0, "beats caption negatives": lambda d: d > 0}
    checked = 0
    for verdict in claims(summary["evaluations"]):
        left, right = map(float, re.findall(r"(-?\d+\.\d{3}) vs [^0-9-]*(-?\d+\.\d{3})", verdict.evidence)[0])
        rule = next(rule for key, rule in rules.items() if key in verdict.text)
        # a verdict only where the interval clears the threshold, and then the one the means give
        assert verdict.met is None or verdict.met == rule(left - right), verdict.text
        checked += verdict.met is not None
    assert checked >= 1


@pytest.mark.slow
def test_the_report_gives_verdicts_only_with_their_intervals_and_says_what_its_cells_are(demo):
    out, _ = demo
    report = (out / "report.md").read_text()
    section = report.split("## What improved and what did not")[1].split("\n## ")[0]
    verdicts = [line for line in section.splitlines() if line.startswith("- ")]
    # the method's claims for LACE, then the targets of the best LACE arm (the default demo runs one)
    assert len(verdicts) == len(CLAIMS) + len(BINDING_TARGETS)
    assert f"Targets of the best LACE arm, {CHOSEN_BEST} (chosen among those run on validation" in section
    claimed, targets = verdicts[:len(CLAIMS)], verdicts[len(CLAIMS):]
    for line in claimed:  # one seed: skewness has no items to resample, so no verdict
        assert line.startswith(("- held: ", "- did not hold: ", "- not decided (n = "))
    for line in targets:  # the ceiling did not run: its share of the gap says so
        assert line.startswith(("- met: ", "- missed: ", "- not decided (n = ", "- not run: "))
    assert [line for line in targets if line.startswith("- not run: ")] == [
        line for line in targets if "the ceiling" in line]
    for line in verdicts:
        if line.startswith(("- held", "- did not hold", "- met", "- missed")):
            assert "95% interval [" in line and "items × 1 run" in line
    assert any(line.startswith("- not decided (n = 1 run): LACE lowers hubness skewness") for line in verdicts)
    # one-way rates are kept per image: their claim rests on the test images
    one_way = next(line for line in verdicts if "LACE lowers the one-way rate" in line)
    assert "95% interval [" in one_way and "items × 1 run" in one_way
    # one seed per variant: no table says "mean ± std" under its single values
    assert "mean ± std" not in report and report.count("one seed each") >= 6


@pytest.mark.slow
def test_the_report_opens_with_what_held_in_distribution_and_on_held_out_pairs_each_with_its_interval(demo):
    out, summary = demo
    report = (out / "report.md").read_text()
    assert report.index("## What held and what did not") < report.index("## Summary")
    section = report.split("## What held and what did not")[1].split("\n## ")[0]
    header = next(line for line in section.splitlines() if line.startswith("| claim |"))
    assert header == "| claim | in distribution (test) | held-out colour-shape pairs (test_comp) |"
    rows = [line.strip("|").split("|") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| claim", "|---"))]
    assert len(rows) == len(STORY)
    texts = [row[0].strip() for row in rows]
    # arms named by role: the best LACE arm is the one validation chose, and it runs in the default demo
    assert f"{CHOSEN_BEST} beats caption negatives on text->image swap-attribute" in texts
    assert f"{BEST_WITH_CAPTIONS} beats caption negatives on image->text swap-attribute" in texts
    assert "LACE (as the method specifies) beats plain on image->text swap-attribute" in texts
    interval = re.compile(r"^(held|did not hold|not decided): [+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]$")
    one_run = re.compile(r"^not decided \(n = 1 run\): [+-]\d\.\d{3}$")
    for row in rows:
        for cell in (cell.strip() for cell in row[1:]):
            # a verdict always with its interval; only a figure without per-item scores (skewness, brittleness)
            # stands alone, not decided on one run
            assert interval.match(cell) or (one_run.match(cell) and ("hubness" in row[0] or "brittleness" in row[0])), (
                row[0], cell)
    # the held-out cells are the compositional split's figures: the estimate is the difference of its means
    best, plain = summary["evaluations"][f"{CHOSEN_BEST} seed 0"], summary["evaluations"]["plain seed 0"]
    held_out = next(row for row in rows if row[0].strip() == f"{CHOSEN_BEST} beats plain on text->image swap-attribute")
    expected = (best["test_comp"]["benchmarks"]["world"]["t2i/swap_attribute"]
                - plain["test_comp"]["benchmarks"]["world"]["t2i/swap_attribute"])
    assert f"{expected:+.3f} [" in held_out[2]


@pytest.mark.slow
def test_per_item_scores_are_kept_and_their_means_are_the_figures(demo):
    _, summary = demo
    for model, splits in summary["evaluations"].items():
        for split, results in splits.items():
            items = results["items"]
            for benchmark in ("world", "retrieval", "diagnostics"):
                figures = results["diagnostics"] if benchmark == "diagnostics" else results["benchmarks"][benchmark]
                for key, scores in items[benchmark].items():
                    assert set(scores) <= {0, 1} and scores, (model, split, key)
                    assert np.mean(scores) == pytest.approx(figures[key], abs=1e-9), key
            assert set(items["diagnostics"]) == {"one_way/image", "one_way/text"}
            assert {"i2t/swap_attribute", "t2i/swap_object", "winoground/group"} <= set(items["world"])
            assert {"i2t/R@1", "t2i/R@1"} <= set(items["retrieval"])


@pytest.mark.slow
def test_rerun_reuses_every_stage(demo):
    out, summary = demo
    again = run_demo(TINY, out, log=lambda _: None)
    assert all(again["reused"].values())
    assert again["evaluations"] == json.loads(json.dumps(summary["evaluations"]))


@pytest.mark.slow
def test_sweep_reuses_the_base_and_reports_every_setting_on_validation(demo, tmp_path):
    out, summary = demo
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text('"M = 1": {n_edits: 1}\n"K = 8": {atoms: 8, sparsity: 2}\n')
    result = run_sweep(TINY, out, read_grid(grid_path), log=lambda _: None)
    for name in ("M = 1", "K = 8"):
        stages = json.loads((setting_folder(out, name) / "results.json").read_text())["reused"]
        assert stages["world"] and stages["base"] and not stages["finetune-LACE-seed0"]
        assert stages["dictionary"] == (name == "M = 1")  # a new size refits the dictionary
    assert set(result["evaluations"]) == {model for model in summary["evaluations"] if model != "base"} | {
        "LACE, M = 1 seed 0", "LACE, K = 8 seed 0"}
    table = (out / "sweep.md").read_text()
    known = _numbers(json.loads((out / "sweep.json").read_text()), set())
    rows = [line for line in table.splitlines() if line.startswith("| LACE, ")]
    assert len(rows) == 2
    cells = [cell.strip() for row in rows for cell in row.strip("|").split("|")[1:]]
    assert cells and all(cell in known for cell in cells if cell)


def test_sweep_grid_errors_name_the_file_and_field(tmp_path):
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text('"bigger world": {world_images: 100}\n')
    with pytest.raises(LaceInputError, match=r"grid\.yaml: field 'bigger world\.world_images'"):
        read_grid(grid_path)


def _results(figures: dict[str, float], n: int = 400) -> dict:
    """One split's results with the given world and retrieval figures (the rest absent), each kept per item as n
    items whose mean is the figure (the first right)."""
    world = {key: value for key, value in figures.items() if "/" in key and not key.startswith("R@")}
    retrieval = {key[3:]: value for key, value in figures.items() if key.startswith("R@ ")}
    items = {name: {key: [1] * round(value * n) + [0] * (n - round(value * n)) for key, value in table.items()}
             for name, table in (("world", world), ("retrieval", retrieval))}
    return {"test": {"benchmarks": {"world": world, "retrieval": retrieval}, "diagnostics": {}, "items": items}}


def test_binding_targets_say_met_missed_or_not_decided_with_the_figures():
    keys = ("i2t/swap_attribute", "t2i/swap_attribute", "i2t/swap_object", "t2i/swap_object", "winoground/group")
    plain = dict.fromkeys(keys, 0.60) | {"R@ i2t/R@1": 0.50, "R@ t2i/R@1": 0.50}
    local = dict.fromkeys(keys, 0.78) | {"t2i/swap_attribute": 0.69, "i2t/swap_object": 0.66, "R@ i2t/R@1": 0.40,
                                         "R@ t2i/R@1": 0.48}
    evaluations = {"plain seed 0": _results(plain), "LACE-local seed 0": _results(local),
                   "caption negatives seed 0": _results(plain | {"t2i/swap_attribute": 0.54}),
                   "LACE-local + caption negatives seed 0": _results(plain | {"t2i/swap_attribute": 0.70}),
                   "ceiling (rendered swaps) seed 0": _results(plain | {"t2i/swap_attribute": 0.705})}
    verdicts = {verdict.text: verdict for verdict in binding_targets(evaluations)}
    status = {text: verdict.status for text, verdict in verdicts.items()}
    # the same 400 items for every arm, the better arm right on every item the other gets right (a paired bootstrap)
    assert status["LACE-local beats plain by >= 10 points on i2t swap-att"] == "met"  # +0.18
    assert status["LACE-local beats plain by >= 10 points on t2i swap-att"] == "not decided"  # +0.09, +-0.03
    assert status["LACE-local beats plain by >= 10 points on i2t swap-obj"] == "missed"  # +0.06, +-0.02
    assert status["LACE-local >= caption negatives on text->image swap-attribute"] == "met"  # +0.15
    assert status["LACE-local + caption negatives >= caption negatives + 5 points on text->image "
                  "swap-attribute"] == "met"  # +0.16
    assert status["LACE-local keeps image->text R@1 within 2 points of plain"] == "missed"  # -0.10
    assert status["LACE-local keeps text->image R@1 within 2 points of plain"] == "not decided"  # -0.02 exactly
    assert status["LACE-local raises Winoground group"] == "met"
    gap = next(verdict for text, verdict in verdicts.items() if "3/4" in text)
    assert gap.estimate == pytest.approx(0.09 / 0.105) and "0.86 of a +0.105 gap" in gap.evidence
    assert gap.status == "not decided"  # a share of a 10-point gap is wide on 400 items
    assert all(verdict.n == "n = 400 items × 1 run" for verdict in verdicts.values())
    missing = binding_targets({"plain seed 0": _results(plain)})
    assert all(verdict.status == "not run" and verdict.met is None for verdict in missing)


@pytest.mark.slow
def test_local_and_ceiling_arms_run_in_the_demo_from_a_reused_base(demo, tmp_path):
    out, _ = demo
    reuse_run(out, tmp_path / "arms")
    arms = ("LACE-local", "ceiling (rendered swaps)")
    local = with_changes(TINY.finetune, {"local": {"n_edits": 2}})
    summary = run_demo(replace(TINY, only_variants=arms, finetune=local), tmp_path / "arms", log=lambda _: None)
    assert summary["reused"]["base"] and summary["reused"]["world"]
    assert set(summary["evaluations"]) == {"base"} | {f"{arm} seed 0" for arm in arms}
    for arm in arms:
        metrics = json.loads(
            (tmp_path / "arms" / "stages" / f"{Run(arm, 0).stage('finetune')}.json").read_text())["result"]["last_metrics"]
        assert metrics["loss"] > 0 and metrics["image_negatives_valid_rows"] > 0  # both edited images
    ceiling = json.loads((tmp_path / "arms" / "stages" / "finetune-ceiling-rendered-swaps-seed0.json").read_text())
    assert ceiling["result"]["last_metrics"]["image_negatives_valid_rows"] > 0.5
    report = (tmp_path / "arms" / "report.md").read_text()
    assert "Targets of the best LACE arm, LACE-local (chosen among those run on validation" in report
    # plain did not run here: every target of the best arm says so rather than guessing
    assert "- not run: LACE-local beats plain by >= 10 points on i2t swap-att — plain not run" in report
    # both arms edit images: every model's provenance, measured with one instrument fitted on the base
    assert set(summary["provenance"]) == set(summary["evaluations"])
    for figures in summary["provenance"].values():
        assert set(figures) == {"images", "local", "rendered"} and figures["rendered"]["n"] > 0
        for source in ("local", "rendered"):
            assert all(value is None or 0.0 <= value <= 1.0 for name, value in figures[source].items()
                       if name not in ("n", "probe_rows", "edit_cosine"))
    assert "## Provenance (held-out images)" in report


@pytest.mark.slow
def test_report_has_zeroshot_and_edit_grids_from_results_and_leaves_wise_ft_to_full(demo):
    out, _ = demo
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    # zero-shot once per model, on the world's three tasks, before and after every fine-tune
    assert set(results["zeroshot"]) == set(results["evaluations"])
    section = report.split("## Zero-shot classification before and after each fine-tune")[1].split("\n## ")[0]
    for model, figures in results["zeroshot"].items():
        assert {"shape/top1", "colour/top1", "count/top1"} <= set(figures)
        row = next(line for line in section.splitlines() if line.startswith(f"| {model} | "))
        assert f"| {figures['shape/top1']:.3f} |" in row
    # the default demo, kept short, leaves WiSE-FT to --full and chosen arms, and says so
    assert "wise_ft" not in results["wall_seconds"] and "--full" in results["wise_ft"]["skipped"]
    assert f"WiSE-FT skipped: {results['wise_ft']['skipped']}" in report
    # the edit grids: where the tiny dictionary owns no atom for a pair, the report says why
    for pair, grid in results["edit_grids"].items():
        if "skipped" in grid:
            assert f"{pair}: grid skipped: {grid['skipped']}" in report
        else:
            check_grid_in_report(grid, report)


@pytest.mark.slow
def test_wise_ft_runs_with_chosen_arms_on_the_default_demos_fine_tunes(demo, tmp_path):
    out = tmp_path / "chosen"
    shutil.copytree(demo[0], out)  # every stage of plain and LACE is the default demo's
    summary = run_demo(replace(TINY, only_variants=("plain", "LACE")), out, log=lambda _: None)
    assert [name for name, reused in summary["reused"].items() if not reused] == ["wise_ft"]
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    # WiSE-FT: plain and LACE at five alphas, alpha 0 being the base's own zero-shot figure
    wise_ft = results["wise_ft"]
    assert (out / "figures" / wise_ft["figure"]).stat().st_size > 1000 and f"(figures/{wise_ft['figure']})" in report
    assert [(p["model"], p["alpha"]) for p in wise_ft["points"]] == [
        (model, alpha) for model in ("plain", "LACE") for alpha in (0.0, 0.25, 0.5, 0.75, 1.0)]
    base = results["zeroshot"]["base"]
    for point in wise_ft["points"]:
        if point["alpha"] == 0.0:
            assert point["zeroshot/shape/top1"] == pytest.approx(base["shape/top1"], abs=1e-6)
        if point["alpha"] == 1.0:
            assert point["zeroshot/shape/top1"] == pytest.approx(
                results["zeroshot"][f"{point['model']} seed 0"]["shape/top1"], abs=1e-6)


def check_grid_in_report(grid: dict, report: str, min_sources: int = 2) -> None:
    """Sources in id order, each before and after the edit at two strengths, counts in the table."""
    sources = list(dict.fromkeys(row["source"] for row in grid["rows"]))
    assert len(sources) >= min_sources and sources == sorted(sources)
    assert {row["strength"] for row in grid["rows"]} == {None, *grid["strengths"]}
    assert f"(figures/{grid['figure']})" in report
    for row in grid["rows"]:
        assert f"| {row['image']} | {row['caption']} | {row['label']} | {row['target_count']} |" in report



@pytest.mark.slow
def test_sigmoid_demo_trains_the_bias_twin_and_reports_beside_softmax(demo, tmp_path, wise_ft_at_two_alphas):
    out, softmax = demo
    reuse_run(out, tmp_path / "sigmoid")
    config = replace(TINY, loss="sigmoid", softmax_run=str(out), only_variants=("plain", "LACE"))
    assert config.model == "lace-micro-rn-sigmoid-32"  # the default model's twin with a logit bias
    summary = run_demo(config, tmp_path / "sigmoid", log=lambda _: None)
    assert summary["reused"]["world"] and not summary["reused"]["base"]  # another model: its own base
    for stage in ("base", "finetune-plain-seed0", "finetune-LACE-seed0"):
        result = json.loads((tmp_path / "sigmoid" / "stages" / f"{stage}.json").read_text())["result"]
        assert result["train_config"]["loss"] == "sigmoid" and "logit_bias" in result["last_metrics"]
    assert summary["softmax_run"]["same_world"] and summary["softmax_run"]["loss"] == "clip"
    report = (tmp_path / "sigmoid" / "report.md").read_text()
    assert "## Sigmoid loss beside softmax" in report and "SigLIP-style" in report
    for row in ("base (clip)", "base (sigmoid)", "plain (clip)", "plain (sigmoid)", "LACE (clip)", "LACE (sigmoid)"):
        assert f"| {row} |" in report, row
    plain_clip = softmax["evaluations"]["plain seed 0"]["test"]["benchmarks"]["retrieval"]["i2t/R@1"]
    assert f"{plain_clip:.3f}" in report.split("## Sigmoid loss beside softmax")[1].split("## What improved")[0]
    assert "Sigmoid loss beside softmax" not in (out / "report.md").read_text()  # the default demo is unchanged
    with pytest.raises(LaceInputError, match="loss"):
        DemoConfig(loss="hinge")
