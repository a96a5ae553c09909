"""`run_flickr8k_study`: LACE measured on real photographs (Flickr8k, locked towers).

Stages, each cached under `<out>/stages/` (a rerun reuses what its inputs still match):
features (one-time tower pass) -> base heads chosen on validation -> concept dictionary
-> geometry and brittleness of the base -> edit retrieval -> fine-tunes from the base
(plain, rule-made caption negatives, LACE and its one-sided variants) over seeds.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lace.concepts.labelled import load_labelled_dictionary
from lace.concepts.vocabulary import load_vocabulary
from lace.config import config_to_dict
from lace.data.flickr8k import read_flickr8k
from lace.edits import EditConfig, build_editor
from lace.edits.captions import RuleNegatives
from lace.encoders.towers import TowersConfig, TowersDualEncoder, save_heads_checkpoint
from lace.errors import LaceInputError
from lace.eval.metrics import retrieval_recall
from lace.experiment.edit_grids import edit_grid_stage
from lace.experiment.parallel import run_stages
from lace.experiment.protocol import ArmStages, Run, by_arm, runs
from lace.experiment.stages import StageRunner, stage_key
from lace.experiment.summary import summarise_over_seeds
from lace.experiment.zeroshot import folder_zeroshot
from lace.io import atomic_write_json, prepare_output_dir
from lace.study.concept_atoms import alignment_figures, fit_dictionary, top_examples
from lace.study.config import HeadsTraining, StudyConfig, heads_from
from lace.study.features import (
    SplitFeatures,
    TextFeatureBank,
    dataset_features,
    rule_negative_captions,
)
from lace.study.heads import (
    CaptionNegatives,
    embed_split,
    fresh_heads,
    load_heads,
    train_on_features,
)
from lace.study.measure import (
    PhraseSwapSet,
    independent_swap_items,
    measure_model,
    rule_brittleness_texts,
    sugarcrepe_style_items,
)
from lace.study.phrase_swaps import KINDS as PHRASE_SWAP_KINDS
from lace.study.phrase_swaps import VERSION as PHRASE_SWAPS_VERSION
from lace.study.report import write_study_report
from lace.study.transplants import transplant_retrieval
from lace.study.zeroshot import CaptionTask, caption_task

MARKER = "study.json"


def prepare_study_folder(out: str | Path, overwrite: bool) -> Path:
    """A fresh folder, or an earlier study's folder to resume in; anything else is refused."""
    out = Path(out)
    if overwrite or not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return prepare_output_dir(out, overwrite)
    if not (out / MARKER).is_file():
        raise LaceInputError(f"{out}: output folder is not empty and holds no earlier study ({MARKER}); "
                             "pass --overwrite to replace it")
    return out


def run_flickr8k_study(config: StudyConfig, log=print) -> dict:
    """Run (or resume) the study; write results.json, report.md and report.html into `config.out`."""
    config.validate()
    study_started = time.perf_counter()
    out = prepare_study_folder(config.out, overwrite=False)
    atomic_write_json(out / MARKER, {"study": "flickr8k", "data": str(config.data)})
    runner = StageRunner(out, log=log)
    inputs = _study_inputs(config, out)  # 1. features, and the rule-made captions encoded once
    encoder, splits, texts = inputs.encoder, inputs.splits, inputs.texts

    # 2. base heads, chosen on validation ---------------------------------------------
    base_key = stage_key(inputs.data_key, [dataclasses.asdict(s) for s in config.base_grid])
    base = runner.run("base", base_key, lambda: _choose_base(encoder, splits, config.base_grid, out, log))
    base_settings = HeadsTraining(**base["grid"][base["chosen"]]["settings"])
    load_heads(encoder, out / base["checkpoint"])
    train_images, train_texts = embed_split(encoder, splits["train"])
    test_images, test_texts = embed_split(encoder, splits["test"])

    # 4. dictionary (fitted before the geometry stage, which uses it for counterfactual brittleness)
    dictionary_key = stage_key(base_key, config.vocabulary, config_to_dict(config.dictionary))
    dictionary_folder = out / "models" / "dictionary"
    dictionary = runner.run("dictionary", dictionary_key, lambda: _dictionary_stage(
        config, (train_images, train_texts, splits["train"]), (test_images, test_texts, splits["test"]),
        inputs.rules, dictionary_folder, log))
    labelled = load_labelled_dictionary(dictionary_folder)
    editor = build_editor(labelled, config.edit)
    measure = partial(_measure, config, inputs, editor)

    # 3. geometry and brittleness of the base ---------------------------------------------
    measure_key = _measure_key(config, dictionary_key, inputs)
    base_figures = runner.run("base-geometry", measure_key, measure)

    # 5. edit retrieval and the edit grid --------------------------------------------------
    transplants, edit_grids = _edit_stages(runner, dictionary_key, config, labelled, test_images, inputs, out)

    # 6. fine-tunes from the base, each saved as a lace-towers heads checkpoint ---------------
    settings = heads_from(base_settings, config.finetune)
    finetunes = _finetunes(encoder, runner, config, splits["train"], settings, out / base["checkpoint"], editor,
                           texts.caption_negatives, measure, measure_key, out)
    load_heads(encoder, out / base["checkpoint"])

    results = {
        "config": dataclasses.asdict(config),
        "data": {name: {"images": len(s.image_paths), "captions": len(s.captions)} for name, s in splits.items()},
        "throughput": inputs.throughput,
        "bank": _bank_counts(inputs),
        "base": base, "base_settings": dataclasses.asdict(base_settings),
        "finetune_settings": dataclasses.asdict(settings), "base_figures": base_figures, "dictionary": dictionary,
        "edit_retrieval": transplants, "edit_grids": edit_grids, "zeroshot_task": inputs.zeroshot_task.summary(),
        "finetunes": finetunes, "summary": summarise(finetunes, base_figures),
        "wall_seconds": {**inputs.wall, **runner.wall_times}, "reused_stages": runner.reused,
        "total_seconds": time.perf_counter() - study_started,
    }
    atomic_write_json(out / "results.json", results)
    write_study_report(results, out)
    return results


def _measure_key(config: StudyConfig, dictionary_key: str, inputs: _StudyInputs) -> str:
    """The key of every measurement: the dictionary's, and each setting a figure reads."""
    return stage_key(dictionary_key, config.edit.n_edits, config.edit, config.rule_brittleness_captions,
                     config.items_per_kind, config.neighbours, inputs.zeroshot_task.summary(), config.zeroshot_root,
                     config.zeroshot_classnames, config.zeroshot_templates, PHRASE_SWAPS_VERSION)


def _bank_counts(inputs: _StudyInputs) -> dict:
    """How many captions the study encoded once: the bank, the training negatives, the items of each family."""
    texts = inputs.texts
    return {"texts": len(texts.bank), "train_negatives": int(texts.negative_valid.sum()), "items": len(texts.items),
            "rule_brittleness_texts": len(texts.brittle_texts),
            "phrase_swap_items": {kind: sum(item["kind"] == kind for item in inputs.phrase_swaps.items)
                                  for kind in PHRASE_SWAP_KINDS}}


@dataclass
class _StudyInputs:
    """What the study's stages read: the towers, the tower features of each split (`data_key` names them), the
    rule-made captions encoded once, the caption-derived zero-shot task with its prompts, and the wall seconds
    of making them."""

    encoder: TowersDualEncoder
    splits: dict[str, SplitFeatures]
    throughput: dict
    data_key: str
    rules: RuleNegatives
    texts: _RuleMadeTexts
    zeroshot_task: CaptionTask
    zeroshot_prompts: TextFeatureBank
    phrase_swaps: PhraseSwapSet
    wall: dict[str, float]


def _study_inputs(config: StudyConfig, out: Path) -> _StudyInputs:
    """The tower features of every split (one pass, cached), then every rule-made caption, zero-shot prompt and independently written swap item."""
    cache_dir = Path(config.feature_cache) if config.feature_cache else out / "features"
    started = time.perf_counter()
    dataset = read_flickr8k(config.data)
    encoder = TowersDualEncoder(TowersConfig())
    splits, throughput = dataset_features(encoder, dataset, cache_dir, config.image_batch_size,
                                          config.num_workers, config.progress)
    train, test = splits["train"], splits["test"]
    wall = {"features": time.perf_counter() - started}
    data_key = stage_key(str(config.data), {n: (len(s.image_paths), len(s.captions)) for n, s in splits.items()},
                         test.captions[:5], train.captions[:5])
    vocabulary = load_vocabulary(config.vocabulary)
    rules = RuleNegatives(vocabulary)
    started = time.perf_counter()
    texts = _rule_made_bank(encoder, rules, train, test, config, cache_dir)
    zeroshot_task = caption_task(vocabulary, test, config.zeroshot_min_images)
    zeroshot_prompts = TextFeatureBank(encoder, zeroshot_task.prompts(), cache_dir, progress=config.progress)
    phrase_swaps = PhraseSwapSet.encode(encoder, independent_swap_items(
        rules, test.captions, test.caption_image_index, config.items_per_kind), cache_dir, config.progress)
    wall["rule-made captions"] = time.perf_counter() - started
    return _StudyInputs(encoder, splits, throughput, data_key, rules, texts, zeroshot_task, zeroshot_prompts,
                        phrase_swaps, wall)


def _measure(config: StudyConfig, inputs: _StudyInputs, editor) -> dict:
    """Every figure of the heads `inputs.encoder` holds now, on test; and zero-shot on the user's image folder,
    through the towers and those heads, where one is given."""
    figures = measure_model(inputs.encoder, inputs.splits["test"], inputs.texts.bank, inputs.rules, inputs.texts.items,
                            editor, config.edit.n_edits, config.rule_brittleness_captions, config.neighbours,
                            inputs.zeroshot_task, inputs.zeroshot_prompts, inputs.phrase_swaps)
    return {**figures, **folder_zeroshot(inputs.encoder, "heads", config)}


def _edit_stages(runner: StageRunner, dictionary_key: str, config: StudyConfig, labelled, test_images: torch.Tensor,
                 inputs: _StudyInputs, out: Path) -> tuple[dict, dict]:
    """The edit-retrieval rows of the named transplants on the base's (N_img, d) test embeddings, and the edit grid
    of the first, each a cached stage."""
    test = inputs.splits["test"]
    transplants = runner.run(
        "edit-retrieval", stage_key(dictionary_key, config.transplants, config.strengths, config.neighbours),
        lambda: {"rows": transplant_retrieval(labelled, test_images, test, inputs.rules, config.transplants,
                                              config.strengths, config.neighbours)})
    edit_grids = runner.run(
        "edit-grids", stage_key(dictionary_key, config.transplants[:1], config.strengths, config.edit),
        lambda: _edit_grids(labelled, test_images, test, config, out / "figures"))
    return transplants, edit_grids


def _edit_grids(labelled, test_images: torch.Tensor, test: SplitFeatures, config: StudyConfig, figures: Path) -> dict:
    """The neighbour grid of the study's first named transplant (grass->snow) over the test images, at the
    weakest and the strongest strength of the edit-retrieval figures."""
    source, target = config.transplants[0]
    strengths = (min(config.strengths), max(config.strengths))
    edit = f"transplant:{source}={target}"

    def load_image(row: int) -> Image.Image:
        with Image.open(test.image_paths[row]) as image:
            return image.convert("RGB")

    if source not in labelled.directions.names or target not in labelled.directions.names:
        return {edit: {"skipped": f"{source} or {target} has no concept direction"}}
    try:  # the editor of the edit-retrieval figures (`transplant_editor`), at each strength
        grid = edit_grid_stage(labelled, test_images, test.captions, test.caption_image_index, edit, load_image,
                               figures / f"edit_grid_{source}_{target}.png", strengths, n_sources=4, k=6,
                               config=dataclasses.replace(EditConfig(), kinds=("transplant",), target=f"{source}={target}"),
                               image_names=[Path(path).name for path in test.image_paths])
    except LaceInputError as error:  # e.g. a concept owning no aligned atom: reported, not hidden
        return {edit: {"skipped": str(error)}}
    return {edit: grid}


def _dictionary_stage(config: StudyConfig, train: tuple, test: tuple, rules: RuleNegatives, folder: Path,
                      log) -> dict:
    """Fit the dictionary on the base's (images, texts, split) of train into `folder`; its alignment
    figures and, on test, the top examples of the best-aligned concepts."""
    train_images, train_texts, train_split = train
    test_images, test_texts, test_split = test
    labelled = fit_dictionary(train_images, train_texts, train_split,
                              dataclasses.replace(config.dictionary, vocabulary=config.vocabulary), folder,
                              config.progress, log)
    figures = alignment_figures(labelled)
    figures["examples"] = top_examples(labelled, test_images, test_texts, test_split, rules, figures,
                                       config.concepts_shown)
    return figures


@dataclass
class _RuleMadeTexts:
    """The study's rule-made captions and their cached tower features."""

    bank: TextFeatureBank
    caption_negatives: CaptionNegatives
    negative_valid: np.ndarray
    items: list[dict]
    brittle_texts: list[str]


def _rule_made_bank(encoder: TowersDualEncoder, rules: RuleNegatives, train: SplitFeatures, test: SplitFeatures,
                    config: StudyConfig, cache_dir: Path) -> _RuleMadeTexts:
    """Encode every rule-made caption once: one negative per training caption (where a rule applies), the
    SugarCrepe-style test items and the rule-brittleness edits, as one list for the text tower (a fixed order, so
    its cache is found again)."""
    negative_texts, negative_valid = rule_negative_captions(rules, train.captions)
    items = sugarcrepe_style_items(rules, test.captions, test.caption_image_index, config.items_per_kind)
    brittle_texts = rule_brittleness_texts(rules, test, config.rule_brittleness_captions)
    bank_texts = [t for t, ok in zip(negative_texts, negative_valid) if ok]
    bank = TextFeatureBank(encoder, bank_texts + [item["negative_caption"] for item in items] + brittle_texts,
                           cache_dir, progress=config.progress)
    bank_rows = [bank.row[t] if ok else 0 for t, ok in zip(negative_texts, negative_valid)]
    caption_negatives = CaptionNegatives(features=bank.features[bank_rows], valid=torch.from_numpy(negative_valid))
    return _RuleMadeTexts(bank, caption_negatives, negative_valid, items, brittle_texts)


def _choose_base(encoder: TowersDualEncoder, splits: dict[str, SplitFeatures], grid: tuple[HeadsTraining, ...],
                 out: Path, log) -> dict:
    """Train every candidate of `grid` from seed 0; keep (and save) the best mean validation R@1."""
    base_path = out / "models" / "base.safetensors"
    rows, best, best_score = [], -1, -1.0
    for i, settings in enumerate(grid):
        fresh_heads(encoder, settings, seed=0)
        summary = train_on_features(encoder, splits["train"], settings, seed=0)
        images, texts = embed_split(encoder, splits["val"])
        recall = retrieval_recall(images, texts, splits["val"].caption_image_index)
        score = 0.5 * (recall["i2t/R@1"] + recall["t2i/R@1"])
        rows.append({"settings": dataclasses.asdict(settings), "train": summary, "val": recall, "val_mean_R@1": score})
        log(f"  base candidate {i}: val mean R@1 {score:.3f} ({summary['seconds']:.1f}s)")
        if score > best_score:
            best, best_score = i, score
            save_heads_checkpoint(encoder, base_path)
    load_heads(encoder, base_path)
    return {"grid": rows, "chosen": best, "checkpoint": str(base_path.relative_to(out))}


def _finetunes(encoder: TowersDualEncoder, runner: StageRunner, config: StudyConfig, train: SplitFeatures,
               settings: HeadsTraining, base_checkpoint: Path, editor, caption_negatives: CaptionNegatives,
               measure, measure_key: str, out: Path) -> dict[str, list[dict]]:
    """Every arm of `config.variants` fine-tuned from the base per seed, each measured on test as it was trained
    (one stage: the heads in hand are the ones measured) and saved as `models/finetune-<arm>-seed<s>.safetensors`
    (what `lace eval` loads)."""

    def finetune(run: Run) -> dict:
        checkpoint = run.model_file(out, ".safetensors")
        load_heads(encoder, base_checkpoint)
        summary = train_on_features(encoder, train, settings, run.seed, run.arm, editor, config.edit, caption_negatives,
                                    config.vocabulary)
        save_heads_checkpoint(encoder, checkpoint)
        return {"train": summary, "figures": measure(), "checkpoint": str(checkpoint.relative_to(out))}

    arms = ArmStages(runs(config.variants, range(config.seeds)), "finetune",
                     lambda run: stage_key(measure_key, dataclasses.asdict(settings), run.arm, run.seed), finetune)
    return by_arm(arms.results(run_stages(runner, arms.stages(), workers=1)))


SUMMARY_METRICS = (
    "i2t/R@1", "i2t/R@5", "i2t/R@10", "t2i/R@1", "t2i/R@5", "t2i/R@10",
    "hubness/i2t/skewness", "hubness/t2i/skewness", "hubness/i2t/hub_occupancy", "hubness/t2i/hub_occupancy",
    "hubness/i2t/antihub_rate", "hubness/i2t/robin_hood", "one_way/image", "one_way/text",
    "mutual_knn/image", "mutual_knn/text", "brittleness/rule/all", "brittleness/counterfactual/all",
    "sugarcrepe_style/replace_att", "sugarcrepe_style/replace_obj", "sugarcrepe_style/replace_rel",
    "sugarcrepe_style/swap_att", "sugarcrepe_style/swap_obj", "sugarcrepe_style/mean",
    "phrase_swaps/swap_att", "phrase_swaps/swap_obj",
)


def summarise(finetunes: dict[str, list[dict]], base_figures: dict) -> dict:
    """Mean and standard deviation over seeds of each summary metric, per variant (and the base)."""
    figures = {"base": [base_figures], **{variant: [run["figures"] for run in runs] for variant, runs in finetunes.items()}}
    seconds = {variant: [run["train"]["seconds"] for run in runs] for variant, runs in finetunes.items()}
    return summarise_over_seeds(figures, SUMMARY_METRICS, seconds)


