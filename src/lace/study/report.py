"""The study report (report.md + self-contained report.html), every number read from results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from lace.experiment.claims import check, difference, figures_samples
from lace.experiment.protocol import Run
from lace.experiment.variants import ROLE_NAMES
from lace.report import plots
from lace.report.document import Report, Table, format_cell, mean_std
from lace.report.experiment_tables import add_edit_grid, zeroshot_table

RETRIEVAL = ("i2t/R@1", "i2t/R@5", "i2t/R@10", "t2i/R@1", "t2i/R@5", "t2i/R@10")
GEOMETRY = ("hubness/i2t/skewness", "hubness/t2i/skewness", "hubness/i2t/hub_occupancy",
            "hubness/t2i/hub_occupancy", "hubness/i2t/antihub_rate", "one_way/image", "one_way/text",
            "mutual_knn/image", "mutual_knn/text")
COMPOSITION = ("brittleness/rule/all", "brittleness/counterfactual/all", "sugarcrepe_style/replace_att",
               "sugarcrepe_style/replace_obj", "sugarcrepe_style/replace_rel", "sugarcrepe_style/swap_att",
               "sugarcrepe_style/swap_obj", "sugarcrepe_style/mean")
PHRASE_SWAPS = ("phrase_swaps/swap_att", "phrase_swaps/swap_obj")
HUB_FIGURES = ("skewness", "robin_hood", "hub_occupancy", "antihub_rate", "largest_hub_share")


def seeds_note(seeds: int) -> str:
    """What a fine-tune's cell or bar is: a single value for one seed, else mean ± sample std over the seeds."""
    return "one seed: single values" if seeds == 1 else f"mean ± sample std (ddof 1) over {seeds} seeds"


def _variant_table(summary: dict, metrics: tuple[str, ...], caption: str) -> Table:
    rows = [["base (no fine-tune)"] + [format_cell(summary["base"][m]["mean"]) for m in metrics]]
    rows += [[variant] + [mean_std(values.get(m)) for m in metrics] for variant, values in summary.items() if variant != "base"]
    return Table(["model"] + list(metrics), rows, caption)


def _thumbnail(path: str, size: int = 160) -> Image.Image:
    with Image.open(path) as image:
        image.draft("RGB", (size, size))
        image = image.convert("RGB")
        image.thumbnail((size, size))
        return image.copy()


def _features_section(report: Report, results: dict, out: Path) -> None:
    """Section 1: the tower features, the rule-made captions encoded once, and each stage's wall time."""
    wall = results["wall_seconds"]
    report.heading("1. Tower features")
    throughput = results["throughput"]
    report.table(Table(
        ["images", "captions", "images/s", "captions/s", "image seconds", "caption seconds", "measured"],
        [[throughput["images"], throughput["captions"], throughput["images_per_second"],
          throughput["captions_per_second"], throughput["image_seconds"], throughput["caption_seconds"],
          "in this run" if throughput.get("computed_in_this_run") else
          "when the cache was filled" if throughput.get("images_per_second") is not None else "not recorded"]],
        "One pass of the locked towers over every image and caption, cached on disk (float32 .npy).", digits=1))
    bank = results["bank"]
    report.paragraph(
        f"Rule-made captions encoded once by the text tower: {bank['texts']} distinct texts "
        f"({bank['train_negatives']} training negatives, one per training caption where a rule applies; "
        f"{bank['items']} SugarCrepe-style test items; {bank['rule_brittleness_texts']} brittleness edits).")
    report.table(Table(["stage", "wall seconds", "reused"],
                       [[name, seconds, results["reused_stages"].get(name)] for name, seconds in wall.items()],
                       "Wall time of each stage (reused: read from an earlier run of this study).", digits=1))


def _base_section(report: Report, results: dict, out: Path) -> None:
    """Section 2: the base heads chosen on validation, and the base on test."""
    base_figures = results["base_figures"]
    data = results["data"]
    report.heading("2. Base heads (plain loss, chosen on validation)")
    grid_rows = []
    for i, row in enumerate(results["base"]["grid"]):
        s = row["settings"]
        grid_rows.append([i, s["hidden_dim"], s["dropout"], s["lr"], s["epochs"], s["weight_decay"], s["batch_size"],
                          s["init_temperature"], row["val"]["i2t/R@1"], row["val"]["t2i/R@1"], row["val_mean_R@1"],
                          row["train"]["seconds"], "yes" if i == results["base"]["chosen"] else ""])
    report.table(Table(["#", "hidden", "dropout", "lr", "epochs", "wd", "batch", "T0", "val i2t R@1", "val t2i R@1",
                        "val mean", "train s", "chosen"], grid_rows,
                       "Candidates; the one with the best mean validation R@1 is the base. Test data never chose anything."))
    chance = 1.0 / data["test"]["images"]
    report.table(Table(list(RETRIEVAL), [[base_figures[m] for m in RETRIEVAL]],
                       f"Base on the {data['test']['images']} test images and {data['test']['captions']} captions "
                       f"(chance at R@1 is {chance:.4f} for t2i)."))


def _geometry_section(report: Report, results: dict, out: Path) -> None:
    """Section 3: hubness, one-way neighbours, mutual k-NN and brittleness of the base."""
    base_figures = results["base_figures"]
    report.heading("3. Geometry of the base")
    hub_rows = [[f"{direction} {name}", base_figures.get(f"hubness/{direction}/{name}"),
                 base_figures.get(f"isotropic/hubness/{direction}/{name}")]
                for direction in ("i2t", "t2i") for name in HUB_FIGURES]
    hub_rows += [[f"one-way {side}", base_figures.get(f"one_way/{side}"), base_figures.get(f"isotropic/one_way/{side}")]
                 for side in ("image", "text")]
    hub_rows += [[f"mutual k-NN {side}", base_figures.get(f"mutual_knn/{side}"),
                  base_figures.get(f"isotropic/mutual_knn/{side}")] for side in ("image", "text")]
    report.table(Table(["figure (k=10)", "base", "isotropic baseline"], hub_rows,
                       "Hubness (i2t: captions as neighbours of images), one-way neighbours and mutual k-NN, "
                       "against isotropic random vectors of the same sizes."))
    brittle = [[name.removeprefix("brittleness/"), int(value) if name.endswith("n_triples") else value]
               for name, value in base_figures.items() if name.startswith("brittleness/")]
    report.table(Table(["brittleness", "base"], brittle,
                       "Share of (image, true caption, one edit) where the edited caption scores above the true one; "
                       "rule edits encoded as captions, counterfactual edits made by the dictionary of section 4."))


def _dictionary_section(report: Report, results: dict, out: Path) -> None:
    """Section 4: the dictionary's quality, its atoms' alignment and each concept's best atom with its top images."""
    figures_dir = out / "figures"
    dictionary = results["dictionary"]
    report.heading("4. Concept dictionary of the base")
    quality = dictionary["quality"]
    report.table(Table(["modality", "FVU", "mean cosine", "mean L0", "dead atoms"],
                       [[m, quality[m]["fvu"], quality[m]["mean_cosine"], quality[m]["mean_l0"],
                         quality[m]["dead_atom_share"]] for m in ("image", "text")],
                       f"{dictionary['n_atoms']} atoms, fitted on base train embeddings of both modalities."))
    report.table(Table(
        ["figure", "caption-mean directions", "shuffled directions"],
        [["mean best atom cosine", dictionary["mean_best_cosine"], dictionary["mean_best_cosine_shuffled"]],
         ["share of concepts with best cosine >= 0.5", dictionary["share_best_at_least_0.5"],
          dictionary["share_best_at_least_0.5_shuffled"]]],
        f"Atom alignment of {dictionary['n_concepts']} concepts (caption-mean directions) against the same directions "
        f"with shuffled coordinates. tau_align = {dictionary['tau_align']:.3f} "
        f"({'calibrated on random directions of the data' if results['config']['dictionary']['tau_align'] is None else 'set'}): "
        f"{dictionary['aligned_atoms']} of {dictionary['n_atoms']} atoms aligned, "
        f"owning {dictionary['concepts_owning_aligned_atoms']} concepts."))
    examples = dictionary["examples"]
    report.table(Table(
        ["concept", "mentions", "best atom", "cosine", "shuffled", "top images naming it", "test base rate",
         "top captions"],
        [[e["concept"], e["mentions"], e["best_atom"], e["best_cosine"], e["shuffled_best_cosine"],
          e["top_images_naming_concept"], e["test_images_naming_concept"], " / ".join(e["captions"])]
         for e in examples],
        "Best atom per concept; its test images and captions with the largest code on that atom."))
    rows = [(f"{e['concept']} #{e['best_atom']}", [_thumbnail(p) for p in e["image_paths"]], None)
            for e in examples if e["image_paths"]]
    if rows:
        grid = plots.image_grid(rows, figures_dir / "atom_top_images.png", "Test images using each best atom most")
        report.figure(grid.relative_to(out), "Top test images of each concept's best atom.")


def _edit_retrieval_section(report: Report, results: dict, out: Path) -> None:
    """Section 5: edit retrieval against its controls, one transplant's code and neighbours, and the edit grids."""
    figures_dir = out / "figures"
    report.heading("5. Edit retrieval on real photographs")
    edit_rows = results["edit_retrieval"]["rows"]
    report.table(Table(
        ["edit", "strength", "edited", "target base rate", "transplant", "random", "arithmetic", "keep transplant",
         "keep random", "angle (deg)", "note"],
        [[f"{r['source']} -> {r['target']}", r["strength"], r.get("n_edited"), r.get("target_base_rate"),
          r.get("transplant/target"), r.get("random/target"), r.get("arithmetic/target"), r.get("transplant/keep"),
          r.get("random/keep"), r.get("angle_degrees"), r.get("skipped", "")] for r in edit_rows],
        f"Share of the {results['config']['neighbours']} nearest real test images (source left out) whose captions "
        "name the target, for the transplant and two controls of the same size; 'keep' is the share that also "
        "keep every concept named by at least 3 of the source's captions."))
    values = {f"{r['source']}->{r['target']} x{r['strength']:g}": {
        "transplant": r.get("transplant/target", np.nan), "random": r.get("random/target", np.nan),
        "arithmetic": r.get("arithmetic/target", np.nan)} for r in edit_rows}
    if values:
        bars = plots.grouped_bars(values, figures_dir / "edit_retrieval.png", "Edit retrieval: target in top-k",
                                  "share of neighbours")
        report.figure(bars.relative_to(out), "Edit retrieval against random and concept-arithmetic edits.")
    examples = [r for r in edit_rows if "example" in r]
    if examples:
        first = examples[0]
        atoms = plots.atom_bars(
            [("before", np.asarray(first["example"]["codes_before"])),
             (f"after {first['source']} -> {first['target']} x{first['strength']:g}",
              np.asarray(first["example"]["codes_after"]))],
            results["dictionary"]["atom_labels"], figures_dir / "transplant_atoms.png",
            "Active atoms of one test image before and after a transplant")
        report.figure(atoms.relative_to(out), "Sparse code of one test image before and after the transplant.")
        grid = plots.image_grid(
            [(f"{r['source']} -> {r['target']} x{r['strength']:g}",
              [_thumbnail(r["example"]["image_path"])] + [_thumbnail(p) for p in r["example"]["neighbour_paths"]],
              ["source"] + [f"#{i + 1}" for i in range(len(r["example"]["neighbour_paths"]))]) for r in examples],
            figures_dir / "transplant_neighbours.png", "A source image and its nearest real images after the edit")
        report.figure(grid.relative_to(out), "Each row: the source test image, then the nearest real test images "
                                             "to its transplanted embedding.")

    report.paragraph("The seed's figure on these photographs: several test images, the first by id whose captions name "
                     "the source and not the target, with their nearest real test images before the transplant, after "
                     "it at the weakest and the strongest strength above, and after a random edit of the same size.")
    for name, grid in results["edit_grids"].items():
        add_edit_grid(report, name, grid)


def _finetunes_section(report: Report, results: dict, out: Path) -> None:
    """Section 6: every fine-tune over seeds: retrieval, geometry, composition, cost and zero-shot."""
    summary = results["summary"]
    base_figures = results["base_figures"]
    figures_dir = out / "figures"
    report.heading("6. Fine-tunes from the base")
    settings = results["finetune_settings"]
    report.paragraph(
        f"Every fine-tune starts from the base heads and sees the same pairs in the same order: {settings['epochs']} "
        f"epochs, lr {settings['lr']}, batch {settings['batch_size']}, {results['config']['edit']['n_edits']} counterfactual "
        f"edits per side, frozen dictionary of section 4; {seeds_note(results['config']['seeds'])}.")
    report.table(_variant_table(summary, RETRIEVAL, "Retrieval on test."))
    report.table(_variant_table(summary, GEOMETRY, "Geometry on test (k=10)."))
    report.table(_variant_table(summary, COMPOSITION,
                                "Brittleness (lower is better) and SugarCrepe-style accuracy (image->text; higher is "
                                "better) on items made from test captions by the rule editor."))
    counts = results["bank"].get("phrase_swap_items") or {}
    if any(counts.values()):
        report.table(_variant_table(summary, PHRASE_SWAPS, (
            "Image->text accuracy on swap items written independently of the rule editor (lace.study.phrase_swaps: "
            "whole phrases exchanged; items the rule editor can also write left out): "
            + ", ".join(f"{kind} {n} items" for kind, n in counts.items()) + ".")))
    report.table(Table(["variant", "train seconds (mean)", "caption negative rows", "image negative rows"],
                       [[v, summary[v]["train_seconds"],
                         float(np.mean([r["train"]["caption_negative_rows"] for r in runs])),
                         float(np.mean([r["train"]["image_negative_rows"] for r in runs]))]
                        for v, runs in results["finetunes"].items()],
                       "Cost of each fine-tune, and the share of batch rows that received a valid extra negative."))
    variants = [v for v in summary if v != "base"]
    for name, metrics, ylabel in (("retrieval", ("i2t/R@1", "t2i/R@1", "i2t/R@5", "t2i/R@5"), "recall"),
                                  ("composition", COMPOSITION, "share")):
        bars = plots.grouped_bars(
            {m: {v: summary[v][m]["mean"] if summary[v][m]["mean"] is not None else np.nan for v in variants}
             for m in metrics},
            figures_dir / f"finetune_{name}.png", f"Fine-tunes: {name}", ylabel,
            errors={m: {v: summary[v][m]["std"] for v in variants} for m in metrics})
        report.figure(bars.relative_to(out), f"Fine-tunes: {name} ({seeds_note(results['config']['seeds'])}).")
    task = results["zeroshot_task"]
    report.paragraph(
        "Zero-shot classification before and after every fine-tune. Flickr8k has no class labels, so the task is a "
        "proxy derived from the test captions: the classes are the vocabulary's objects; an image belongs to a class "
        f"when that object is the only one named by at least {task['consensus']:.0%} of its captions, and a class "
        f"needs {task['min_images']} such images ({len(task['classes'])} classes, {task['images']} images: "
        + ", ".join(f"{c} {n}" for c, n in task["images_per_class"].items()) + "); other images are left out. "
        "Each class is the mean of the prompts " + " / ".join(f"'{t}'" for t in task["templates"]) + ". Columns "
        "`captions/*` are this task; any other task is the image folder given with --zeroshot-root.")
    report.table(zeroshot_table(zeroshot_by_model(results), "top-1 per task, then top-5 and mean per-class recall"))
    counts = {"base": np.asarray(base_figures["nk/i2t"])}
    counts.update({v: np.asarray(runs[0]["figures"]["nk/i2t"]) for v, runs in results["finetunes"].items()})
    histogram = plots.nk_histograms(counts, figures_dir / "nk_i2t.png", "N_10 of captions (image queries)", 10)
    report.figure(histogram.relative_to(out), "How often each test caption is in an image's top 10 (first seed).")


def _statement_section(report: Report, results: dict, out: Path) -> None:
    """Section 7: the plain statement of what LACE changed."""
    report.heading("7. What LACE changed, and what it did not")
    report.bullets(base_statement(results) + plain_statement(results["finetunes"]))
    report.bullets(CAVEATS)


SECTIONS = (_features_section, _base_section, _geometry_section, _dictionary_section, _edit_retrieval_section,
            _finetunes_section, _statement_section)
"""The report's sections in reading order."""


def write_study_report(results: dict, out: Path) -> tuple[Path, Path]:
    """report.md and report.html of a finished study (read from its results), with their figures under out/figures."""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    report = Report("LACE on real photographs: Flickr8k with locked towers")
    data = results["data"]
    report.paragraph(
        "Frozen EfficientNet-Lite0 (images) and all-MiniLM-L6-v2 (captions) towers with trainable heads (LiT style), "
        f"trained and measured on Flickr8k's fixed split ({data['train']['images']} train, {data['val']['images']} "
        f"validation, {data['test']['images']} test images; five captions each). Everything below is read from "
        "results.json in this folder.")
    for section in SECTIONS:
        section(report, results, out)
    return report.write(out)


CAVEATS = (
    ("SugarCrepe-style items here are image->text only: the rule editor changes captions, and real photographs "
     "have no edited counterpart image, so there is no text->image version of these items."),
    ("Counterfactual brittleness of every fine-tune uses the dictionary fitted on the base; the heads drift "
     "little in a short fine-tune, but the dictionary is not refitted per model."),
    ("Rule-made training negatives are one fixed draw per training caption (encoded once by the locked text "
     "tower), not a fresh draw per epoch as `lace train` makes them."),
)

COMPARED = (("i2t/R@1", "higher"), ("t2i/R@1", "higher"), ("hubness/i2t/skewness", "lower"),
            ("one_way/image", "lower"), ("brittleness/rule/all", "lower"), ("brittleness/counterfactual/all", "lower"),
            ("sugarcrepe_style/mean", "higher"))


def zeroshot_by_model(results: dict) -> dict[str, dict]:
    """Model ("base", "<variant> seed <s>") -> its `zeroshot/*` figures, prefix dropped."""
    def zeroshot(figures: dict) -> dict:
        return {key.removeprefix("zeroshot/"): value for key, value in figures.items() if key.startswith("zeroshot/")}

    models = {"base": zeroshot(results["base_figures"])}
    for variant, runs in results["finetunes"].items():
        models.update({Run(variant, seed).label: zeroshot(run["figures"]) for seed, run in enumerate(runs)})
    return models


def base_statement(results: dict) -> list[str]:
    """What the base and its dictionary show, before any fine-tune, in numbers."""
    figures = results["base_figures"]
    lines = []
    skew, iso = figures.get("hubness/i2t/skewness"), figures.get("isotropic/hubness/i2t/skewness")
    one_way, iso_one_way = figures.get("one_way/image"), figures.get("isotropic/one_way/image")
    if None not in (skew, iso, one_way, iso_one_way):
        lines.append(f"Hubness and one-way neighbours of the base: N_10 skewness {skew:.2f} over captions "
                     f"({'above' if skew > iso else 'not above'} isotropic vectors, {iso:.2f}); one-way rate of "
                     f"images {one_way:.2f} ({'above' if one_way > iso_one_way else 'not above'} isotropic, "
                     f"{iso_one_way:.2f}).")
    rule, counterfactual = figures.get("brittleness/rule/all"), figures.get("brittleness/counterfactual/all")
    if rule is not None:
        lines.append(f"Brittleness of the base: a single rule edit beats the true caption in {rule:.1%} of triples"
                     + (f", a counterfactual caption embedding in {counterfactual:.1%}." if counterfactual is not None
                        else "."))
    for row in results["edit_retrieval"]["rows"]:
        if "transplant/target" in row and row["strength"] == max(r["strength"] for r in results["edit_retrieval"]["rows"]):
            lines.append(f"Transplant {row['source']} -> {row['target']} at strength {row['strength']:g}: "
                         f"{row['transplant/target']:.2f} of the nearest real images name the target, against "
                         f"{row['random/target']:.2f} for a random edit of the same size and "
                         f"{row['arithmetic/target']:.2f} for concept arithmetic (base rate "
                         f"{row['target_base_rate']:.2f}).")
    return lines


def plain_statement(finetunes: dict[str, list[dict]]) -> list[str]:
    """One sentence per (variant, metric) against the plain fine-tune (`finetunes`: variant -> per seed
    {"figures": ...}): the difference, and better or worse only where its bootstrap interval over seeds lies wholly
    on one side of no change (`lace.experiment.claims`), else not decided."""
    if "plain" not in finetunes:
        return ["No plain fine-tune was run, so nothing is compared."]

    samples = figures_samples({variant: [run["figures"] for run in runs] for variant, runs in finetunes.items()})
    lines = []
    for variant in [v for v in finetunes if v != "plain"]:
        arms = dict.fromkeys(ROLE_NAMES) | {"plain": "plain", "best": variant}
        parts = []
        for metric, better in COMPARED:
            verdict = check(difference(metric, metric, "best", "plain", ">" if better == "higher" else "<"), arms,
                            samples)
            if verdict.estimate is None:
                continue
            ours, plain = (np.mean([run.value for run in samples(arm, metric, "")]) for arm in (variant, "plain"))
            word = {"met": "better", "missed": "worse" if verdict.estimate else "no change"}.get(
                verdict.status, f"not decided, {verdict.n}")
            parts.append(f"{metric} {ours:.3f} vs {plain:.3f} ({verdict.estimate:+.3f}, {word})")
        lines.append(f"{variant} against plain: " + "; ".join(parts) + ".")
    return lines
