"""The demo's report: every number comes from `results.json`, every plot from those numbers."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lace.demo.columns import (
    BINDING_COLUMNS,
    GEOMETRY_COLUMNS,
    SUMMARY_COLUMNS,
    seed_values,
    variant_of,
)
from lace.demo.config import CALIBRATION_TOLERANCE, CLIP_SUGARCREPE
from lace.demo.stage_times import quiet_wall_estimate
from lace.demo.targets import STORY_SPLITS, VERDICT_NOTE, binding_targets, claims, demo_roles, story
from lace.experiment.claims import Verdict, describe, spread
from lace.report.document import Report, Table
from lace.report.experiment_tables import add_edit_grid, wise_ft_table, zeroshot_table
from lace.report.plots import grouped_bars, nk_histograms

CALIBRATION_KEYS = {
    "swap_attribute": "i2t/swap_attribute", "swap_object": "i2t/swap_object",
    "replace_attribute": "i2t/replace_attribute", "replace_relation": "i2t/replace_relation",
}


def aggregate(evaluations: dict, split: str, columns) -> dict[str, list[tuple[float | None, float | None]]]:
    """Per variant, per column: (mean, sample std over seeds); std is None for a single run."""
    return {variant: [(float(np.mean(values)), spread(values)) if values else (None, None) for values in row]
            for variant, row in seed_values(evaluations, split, columns).items()}


def _cell(mean: float | None, std: float | None) -> str | float | None:
    if mean is None or std is None:
        return mean
    return f"{mean:.3f} ± {std:.3f}"


def spread_note(evaluations: dict) -> str:
    """What a table's cells are: single values when every variant ran one seed, else mean ± sample std."""
    seeds = Counter(variant_of(model) for model in evaluations if model != "base")
    most = max(seeds.values(), default=1)
    return "one seed each" if most == 1 else f"mean ± std over up to {most} seeds (sample std, ddof 1)"


def results_table(evaluations: dict, split: str, columns, caption: str) -> Table:
    rows = [[variant] + [_cell(m, s) for m, s in cells] for variant, cells in aggregate(evaluations, split, columns).items()]
    return Table(["model"] + [c[0] for c in columns], rows, caption=f"{caption}; {spread_note(evaluations)}")


def calibration_rows(base_val: dict) -> list[list]:
    rows = []
    for family, target in CLIP_SUGARCREPE.items():
        value = base_val["benchmarks"]["world"].get(CALIBRATION_KEYS[family])
        within = None if value is None else abs(value - target) <= CALIBRATION_TOLERANCE
        rows.append([family, value, target, within])
    retrieval = base_val["benchmarks"]["retrieval"]
    rows.append(["R@1 t2i (chance 1/N images)", retrieval.get("t2i/R@1"), None, None])
    return rows


def write_demo_report(summary: dict, out: Path) -> tuple[Path, Path]:
    """report.md and report.html under `out` from the demo's `summary` (results.json), section by section."""
    out = Path(out)
    report = Report("LACE on the shapes world")
    for section in SECTIONS:
        section(report, summary, out)
    return report.write(out)


def tagged(evaluations: dict, tag: str) -> dict:
    """`evaluations` with every model renamed `<variant> (<tag>)[ seed s]`, so two runs share one table."""
    return {f"{variant_of(model)} ({tag}){model[len(variant_of(model)):]}": results
            for model, results in evaluations.items()}


def interleaved(first: dict, second: dict) -> dict:
    """The models of two tagged runs, each variant's rows of `first` then those of `second`."""
    variants = list(dict.fromkeys(variant_of(m).rsplit(" (", 1)[0] for m in [*first, *second]))
    return {m: r for v in variants for runs in (first, second) for m, r in runs.items()
            if variant_of(m).rsplit(" (", 1)[0] == v}


def add_loss_comparison(report: Report, summary: dict) -> None:
    """The sigmoid run's figures beside the softmax run's (`summary["softmax_run"]`), variant by variant."""
    other = summary["softmax_run"]
    report.heading("Sigmoid loss beside softmax")
    if not other["same_world"]:
        report.bullets([(f"{other['path']}: made on another world than this run; its figures are not "
                         "comparable and are left out")])
        return
    report.paragraph(
        f"This run trained {summary['config']['model']} with SigLIP's sigmoid loss (a learned logit bias; "
        f"counterfactual negatives as extra z = -1 terms); the softmax rows are {other['model']} with the CLIP loss, "
        f"from {other['path']} (seed {other['seed']}), on the same world, with the same steps and data order."
    )
    mine, theirs = tagged(summary["evaluations"], "sigmoid"), tagged(other["evaluations"], other["loss"])
    for split, title in (("test", "in-distribution test"), ("test_comp", "compositional test")):
        report.table(results_table(interleaved(theirs, mine), split, SUMMARY_COLUMNS, f"{title} split; binding "
                                   "accuracy (chance 0.5), Winoground group, recall@1, skewness of N10, one-way rate"))
    zeroshot = interleaved(tagged(other["zeroshot"], other["loss"]), tagged(summary["zeroshot"], "sigmoid"))
    report.table(zeroshot_table(zeroshot, "zero-shot on the world's tasks, top-1 per task (chance 1/classes)"))


STATUS_WORDS = {"met": "held", "missed": "did not hold"}
"""How the report words a verdict's status."""


def verdict_cell(verdict: Verdict) -> str:
    """One verdict in a few words: "held: +0.146 [+0.098, +0.190]", "not decided: …", "not run"."""
    status = STATUS_WORDS.get(verdict.status, verdict.status)
    if verdict.estimate is None:
        return status
    if verdict.interval is None:
        return f"{status} ({verdict.n}): {verdict.estimate:+.3f}"
    low, high = verdict.interval
    return f"{status}: {verdict.estimate:+.3f} [{low:+.3f}, {high:+.3f}]"


def _opening_section(report: Report, summary: dict, out: Path) -> None:
    """What held and what did not, in plain words, in distribution and on held-out colour-shape pairs (`story`)."""
    verdicts = story(summary["evaluations"])
    report.heading("What held and what did not")
    arms = demo_roles(summary["evaluations"])
    report.paragraph(
        f"Each line compares two fine-tunes of one base: plain, caption negatives (rule-made caption edits), LACE as "
        f"the method specifies it, {arms['best'] or 'the best LACE arm'} (the LACE arm validation chose) and "
        f"{arms['best_with_text_only'] or 'it with caption negatives'}. Each cell is the difference (first arm minus "
        "second) with its 95% bootstrap interval over test items; a claim held or did not hold only where the whole "
        "interval lies on one side of its threshold, else it is not decided. The held-out colour-shape pairs are "
        "scenes whose colour-shape combinations never occur in training (the compositional test split).")
    counts = {split: Counter(STATUS_WORDS.get(v.status, v.status) for v in found) for split, found in verdicts.items()}
    report.table(Table(["claim"] + [f"{name} ({split})" for split, name in STORY_SPLITS.items()],
                       [[first.text] + [verdict_cell(verdicts[split][row]) for split in STORY_SPLITS]
                        for row, first in enumerate(verdicts["test"])],
                       caption="; ".join(f"{STORY_SPLITS[split]}: " + ", ".join(f"{n} {word}" for word, n in
                                                                             count.items())
                                         for split, count in counts.items())))


def _summary_section(report: Report, summary: dict, out: Path) -> None:
    """What was run, the headline table and which claims held (and, for a sigmoid run given a softmax one, the
    two side by side)."""
    evaluations = summary["evaluations"]
    sigmoid = summary["config"].get("loss") == "sigmoid"
    kind = "SigLIP-style model (sigmoid loss, learned logit bias)" if sigmoid else "CLIP"
    report.paragraph(
        f"A {summary['config']['model']} {kind} (lace-tiny family) is pretrained from scratch on web-like captions "
        "of a rendered shapes world "
        "(the base that does not bind), then fine-tuned on COCO-like captions in each variant below, with the "
        "same data order, seeds and steps. Every number here is read from results.json in this folder."
    )
    report.heading("Summary (in-distribution test split)")
    report.table(results_table(evaluations, "test", SUMMARY_COLUMNS,
                               "binding accuracy (chance 0.5), Winoground group (chance 1/6), recall@1, hubness skewness of N10, one-way rate"))
    if "softmax_run" in summary:
        add_loss_comparison(report, summary)
    report.heading("What improved and what did not")
    report.paragraph(VERDICT_NOTE)
    report.bullets([describe(verdict, ("held", "did not hold")) for verdict in claims(evaluations)])
    best = demo_roles(evaluations)["best"]
    if best is not None:
        report.paragraph(f"Targets of the best LACE arm, {best} (chosen among those run on validation, by mean "
                         "swap-attribute both ways), on the in-distribution test split:")
        report.bullets([describe(verdict) for verdict in binding_targets(evaluations)])


def _calibration_section(report: Report, summary: dict, out: Path) -> None:
    """The base against CLIP ViT-B/32's SugarCrepe failure, on validation."""
    report.heading("Calibration of the base (validation split)")
    report.paragraph(
        "The world's knobs were chosen so that the base fails the way CLIP ViT-B/32 fails on SugarCrepe "
        f"(Hsieh et al. 2023), each family within {CALIBRATION_TOLERANCE:.2f}; measured on the validation split only."
    )
    report.table(Table(["family (image->text)", "base", "CLIP ViT-B/32", f"within {CALIBRATION_TOLERANCE:.2f}"],
                       calibration_rows(summary["evaluations"]["base"]["val"])))


def _split_sections(report: Report, summary: dict, out: Path) -> None:
    """Binding, retrieval and geometry tables of every split, and the isotropic baseline."""
    evaluations = summary["evaluations"]
    for split, title in (("test", "in-distribution test"), ("test_comp", "compositional test (held-out colour-shape pairs)"),
                         ("val", "validation")):
        report.heading(f"Binding, {title}")
        report.table(results_table(evaluations, split, BINDING_COLUMNS, "accuracy"))
        report.heading(f"Retrieval and geometry, {title}")
        report.table(results_table(evaluations, split, GEOMETRY_COLUMNS,
                                   "R@k; skewness of N10; one-way rates; brittleness = share of edits scoring above the true caption"))
    base_test = evaluations["base"]["test"]["diagnostics"]
    report.paragraph(
        "Isotropic baseline of the same sizes (random unit vectors): one-way image rate "
        f"{base_test.get('isotropic/one_way/image', float('nan')):.3f}, text rate "
        f"{base_test.get('isotropic/one_way/text', float('nan')):.3f}, skewness of N10 (t2i) "
        f"{base_test.get('isotropic/hubness/t2i/skewness', float('nan')):.3f}."
    )


def _ablation_section(report: Report, summary: dict, out: Path) -> None:
    """Bars per variant on the test split, and the N10 histograms."""
    evaluations, figures = summary["evaluations"], out / "figures"
    chart_columns = (BINDING_COLUMNS[0], BINDING_COLUMNS[6], BINDING_COLUMNS[1], BINDING_COLUMNS[7],
                     BINDING_COLUMNS[12], GEOMETRY_COLUMNS[0])
    table = aggregate(evaluations, "test", chart_columns)
    values = {c[0]: {v: cells[i][0] for v, cells in table.items() if cells[i][0] is not None}
              for i, c in enumerate(chart_columns)}
    errors = {c[0]: {v: (cells[i][1] or 0.0) for v, cells in table.items()} for i, c in enumerate(chart_columns)}
    chance = {column[0]: 0.5 for column in chart_columns[:4]} | {BINDING_COLUMNS[12][0]: 1 / 6}
    chart = grouped_bars(values, figures / "ablation.png", "ablation on the test split", "score", errors, chance=chance)
    report.heading("Ablation")
    report.figure(chart.relative_to(out), "binding and retrieval per variant (test split; dashed: chance, 0.5 for "
                  f"binding and 1/6 for Winoground group; error bars: {spread_note(evaluations)})")
    first_seed = {variant_of(m): r for m, r in evaluations.items()}
    hist = nk_histograms({v: np.array(r["test"]["n_k"]["t2i"]) for v, r in first_seed.items()},
                         figures / "nk_histograms.png", "N10 of images among captions' top-10 (test)", 10)
    report.figure(hist.relative_to(out), "hubness: how often each test image is in a caption's top-10")


PROVENANCE_COLUMNS = (
    ("real image prefers its caption", "real_image_prefers_its_caption"),
    ("edited image prefers edited caption", "edited_image_prefers_edited_caption"),
    ("real caption prefers real image", "real_caption_prefers_real_image"),
    ("edited caption prefers edited image", "edited_caption_prefers_edited_image"),
    ("edit cosine", "edit_cosine"),
    ("probe AUC real vs edited", "probe_auc"),
    ("probe AUC round trip vs edited", "probe_auc_round_trip"),
    ("probe AUC nuisance vs edited", "probe_auc_nuisance"),
    ("probe AUC no-op vs edited", "probe_auc_no_op"),
)
"""The provenance table's columns (header, figure); a figure no model has (the symmetric counterparts' probes of the
rendered swaps) is left out."""


def provenance_table(provenance: dict, source: str, caption: str) -> Table:
    """One row per variant (base first, as given): each figure of `source` ("local" or "rendered"), mean ± sample std
    over seeds, and the rows the preferences were measured on."""
    by_variant: dict[str, list[dict]] = {}
    for model, figures in provenance.items():
        by_variant.setdefault(variant_of(model), []).append(figures[source])
    columns = [(name, key) for name, key in PROVENANCE_COLUMNS
               if any(key in run for runs in by_variant.values() for run in runs)]
    rows = []
    for variant, runs in by_variant.items():
        cells = []
        for _, key in columns:
            values = [run[key] for run in runs if run.get(key) is not None]
            cells.append(_cell(float(np.mean(values)), spread(values)) if values else None)
        rows.append([variant] + cells + [int(np.mean([run["n"] for run in runs]))])
    return Table(["model"] + [name for name, _ in columns] + ["rows"], rows, caption=caption)


def _provenance_section(report: Report, summary: dict, out: Path) -> None:
    """Whether each model tells edited images from real ones by how they were made (runs with image edits only)."""
    provenance = summary.get("provenance")
    if not provenance:
        return
    report.heading("Provenance (held-out images)")
    images = provenance["base"]["images"]
    report.paragraph(
        "Every model is measured with one instrument: the local editor fitted once on the base, whose binding swap "
        "(two found objects exchange their colours) edits each held-out image inside the tower of the model "
        "measured, with the image's first caption and the caption the swap describes. A preference is the share "
        "of rows where the first similarity beats the second (0.5 if the model cannot tell); an edited caption "
        "that prefers the real image is the provenance shortcut. The probe is a linear classifier of real against "
        f"edited image embeddings fitted on the validation split ({images['val']} images) and scored on the test "
        f"split ({images['test']} images; AUC 0.5: the edit leaves no trace of how it was made). The world's "
        "rendered colour swaps of the same scenes are the reference. The same probe between each swap and an "
        "artefact-symmetric counterpart of its real image, made through the same operator path (round trip: the "
        "swap and back; nuisance: the objects moved to a lighter shade of their own colour; no-op: the identity "
        "move), is the probe AUC between positives and negatives as a symmetric arm shows them to the loss.")
    note = spread_note(provenance)
    report.table(provenance_table(provenance, "local", f"the instrument's binding swaps (test split); {note}"))
    report.table(provenance_table(provenance, "rendered", f"the world's rendered colour swaps (test split); {note}"))


def _dictionary_section(report: Report, summary: dict, out: Path) -> None:
    """The dictionary's fit, its aligned atoms and the atom bars of one image's edits."""
    dictionary = summary["dictionary"]
    report.heading("The concept dictionary (fitted on the base)")
    quality = dictionary["quality"]
    report.table(Table(["modality", "FVU", "cos(c, aD)", "mean L0", "dead atoms"], [
        [m, quality[m]["fvu"], quality[m]["mean_cosine"], quality[m]["mean_l0"], quality[m]["dead_atom_share"]]
        for m in ("image", "text") if m in quality]))
    report.paragraph(
        f"{dictionary['aligned_atoms']} of {dictionary['atoms']} atoms are aligned (cosine >= tau_align = "
        f"{dictionary['tau_align']:.3f}, the 95th percentile of the best cosine atoms reach with as many "
        f"isotropic random directions as there are concepts) with {dictionary['concepts_with_aligned_atom']} of "
        f"{dictionary['concepts']} concepts. Random directions shaped by the data's covariance would have asked for "
        f"{dictionary['tau_align_data_covariance']:.3f}. Binding directions: {dictionary['binding_compounds']} "
        "attribute-object compounds."
    )
    atom_bars = dictionary["atom_bars"]
    if "skipped" in atom_bars:
        report.bullets([f"atom bar chart skipped: {atom_bars['skipped']}"])
    else:
        report.figure("figures/atom_bars.png", "active atoms of one validation image, before and after each edit: "
                      f"{atom_bars['caption']}")
        report.table(Table(["edit", "cosine to the original embedding"],
                           [[e["edit"], e["cosine_to_original"]] for e in atom_bars["edits"]]))


def _edit_retrieval_section(report: Report, summary: dict, out: Path) -> None:
    """Transplants looked up among real test images, the edit kinds' checks, and the edit grids."""
    edits = summary["edit_retrieval"]
    report.heading("Edit retrieval (test images)")
    rows = [[pair, f["transplant/target"], f["random/target"], f["arithmetic/target"], f.get("transplant/keep"),
             f["angle_degrees"], f["edited"]] for pair, f in edits["transplants"].items() if "skipped" not in f]
    report.table(Table(["transplant", "top-10 show target", "random edit, same size", "concept arithmetic",
                        "keep other concepts", "edit angle (deg)", "images"], rows))
    report.table(Table(["edit kind", "proposed", "pass effect check", "nearest caption changes", "random control changes"],
                       [[kind, v["proposed"], v["passed_check_share"], v["nearest_changed_share"],
                         v["random_nearest_changed_share"]] for kind, v in edits["edit_kinds"].items()]))
    skipped = [f"{pair}: {f['skipped']}" for pair, f in edits["transplants"].items() if "skipped" in f]
    if skipped:
        report.bullets(skipped)
    report.heading("Edit grids (test images)")
    report.paragraph("Nearest real test images of several source images before a transplant, after it (at the "
                     "strength of the figures above and at four times it) and after a random edit of the same size; "
                     "each row counts the neighbours whose captions name the target.")
    for pair, grid in summary["edit_grids"].items():
        add_edit_grid(report, pair, grid)


def _zeroshot_section(report: Report, summary: dict, out: Path) -> None:
    """Zero-shot before and after each fine-tune, and the WiSE-FT trade-off."""
    report.heading("Zero-shot classification before and after each fine-tune")
    report.paragraph("The world's built-in tasks (shape and colour of one-object scenes, count of one to four "
                     "objects), scored as CLIP_benchmark scores an image folder: each class the mean of its prompts.")
    report.table(zeroshot_table(summary["zeroshot"], "top-1 per task (chance 1/classes), then top-5 and mean per-class recall"))
    report.heading("WiSE-FT: zero-shot against binding")
    wise_ft = summary["wise_ft"]
    if "skipped" in wise_ft:
        report.bullets([f"WiSE-FT skipped: {wise_ft['skipped']}"])
    else:
        report.figure(f"figures/{wise_ft['figure']}", "each fine-tune mixed into the base at alpha "
                      + ", ".join(f"{alpha:g}" for alpha in wise_ft["alphas"]) + f" (test split; y: {wise_ft['binding_metric']})")
        report.table(wise_ft_table(wise_ft))


def _time_section(report: Report, summary: dict, out: Path) -> None:
    """Wall and CPU seconds per stage, and how busy the machine was."""
    report.heading("Time per stage")
    cpu = summary.get("cpu_seconds", {})
    report.table(Table(["stage", "wall seconds", "CPU seconds", "reused from cache"],
                       [[name, seconds, cpu.get(name), summary.get("reused", {}).get(name)]
                        for name, seconds in summary["wall_seconds"].items()], digits=1))
    machine = summary.get("machine")
    if machine:
        workers = machine.get("workers", 1)
        side_by_side = (f"; the stages after the dictionary ran side by side in {workers} one-thread worker "
                        "processes, so their wall seconds overlap" if workers > 1 else "")
        report.bullets([(f"{machine['threads']} intra-op threads on {machine['cpus']} CPUs{side_by_side}; load average "
                         f"(1, 5, 15 min) {machine['load_average_at_start']} at the start, "
                         f"{machine['load_average_at_end']} at the end; CPU seconds count all threads of "
                         "this process, so on a busy machine they show the work and wall seconds the wait"),
                        f"all stages together: {sum(filter(None, cpu.values())):.1f} CPU seconds"
                        + (f"; from the start to the report {machine['wall_seconds_before_report']:.1f} wall seconds"
                           if "wall_seconds_before_report" in machine else ""),
                        (f"estimated wall time on a quiet machine with these threads and workers: "
                         f"{quiet_wall_estimate(summary):.0f} s (this process's stages one after the other, each "
                         "its CPU seconds over its threads; the side-by-side stages' CPU seconds shared over the "
                         "workers; interpreter start and imports not counted)")])


def _configuration_section(report: Report, summary: dict, out: Path) -> None:
    report.heading("Configuration and seeds")
    report.code(json.dumps({"demo": summary["config"], "world": summary["world"]}, indent=1))


SECTIONS: tuple[Callable[[Report, dict, Path], None], ...] = (
    _opening_section, _summary_section, _calibration_section, _split_sections, _ablation_section, _provenance_section,
    _dictionary_section,
    _edit_retrieval_section, _zeroshot_section, _configuration_section, _time_section)
"""The report's sections in reading order, the time per stage its footer: each writes its headings, tables and
figures from the summary."""


def summary_markdown(summary: dict) -> str:
    """The summary table, for the terminal."""
    return results_table(summary["evaluations"], "test", SUMMARY_COLUMNS, "test split").markdown()
