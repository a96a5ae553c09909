"""Every training arm on Flickr8k with the tops of the towers trainable, over seeds, as cached stages.

From the base (heads on a share of the training images, `lace.study.flickr8k_top`), each arm fine-tunes the
tops and heads on the other images through `lace.train.train` on cached tower-top inputs, with the same data
order, steps and seed, and is measured on one split: retrieval and SugarCrepe-style image->text items made by
the rule editor from that split's captions (swap-type items are the binding measure real photographs allow;
text->image swaps need counterfactual photographs, which only the world has).

    run_tops_study(TopsStudyConfig(data, out, arms=("plain", "LACE-local"), seeds=3, split="val"))

Stages live in `<out>/stages/` (`lace.experiment.stages`): the base, the dictionary, the local editor's figures,
one training stage and one measuring stage per arm and seed. Each fine-tune is saved as a `lace-towers`
checkpoint (`lace eval` loads it); a rerun reuses both and only measures what a split lacks, so the test split
is measured once, at the end, on models chosen nothing on it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import torch

from lace.concepts.labelled import load_labelled_dictionary
from lace.concepts.vocabulary import load_vocabulary
from lace.config import config_to_dict, with_changes
from lace.data.flickr8k import read_flickr8k
from lace.edits import build_editor
from lace.edits.captions import RuleNegatives
from lace.encoders.towers import (
    TowersDualEncoder,
    TowersTop,
    cached_text_top_features,
    encode_captions,
    fresh_token_states,
    load_towers_checkpoint,
    save_top_checkpoint,
)
from lace.experiment import claims
from lace.experiment.parallel import run_stages
from lace.experiment.protocol import ArmStages, Measure, Run, by_arm, runs
from lace.experiment.stages import StageRunner, stage_key
from lace.experiment.summary import summarise_over_seeds
from lace.experiment.variants import ROLE_NAMES, ROLES, variant_config
from lace.experiment.zeroshot import folder_zeroshot
from lace.io import atomic_write_json, atomic_write_text
from lace.local.codes import LocalConceptCodes
from lace.local.config import LocalEditConfig
from lace.local.cut_recolour import fit_cut_operator
from lace.local.editor import group_mentions
from lace.local.maps import MapEditor, fit_map_editor, regions_of
from lace.report.document import Table, mean_std
from lace.study.concept_atoms import alignment_figures, fit_dictionary
from lace.study.config import TopsStudyConfig
from lace.study.features import SplitFeatures, captions_by_image, rule_negative_captions
from lace.study.flickr8k import MARKER, prepare_study_folder
from lace.study.flickr8k_top import (
    TopSplit,
    base_images,
    cut_photographs,
    embed_top_split,
    heads_base,
    recall_of,
    top_splits,
)
from lace.study.heads import train_summary
from lace.study.measure import (
    independent_swap_items,
    item_correct,
    score_items,
    sugarcrepe_style_items,
)
from lace.study.phrase_swaps import VERSION as PHRASE_SWAPS_VERSION
from lace.train import TrainConfig
from lace.train.data import TopPairs

BINDING_KINDS = ("swap_att", "swap_obj")
METRICS = ("i2t/R@1", "t2i/R@1", "i2t/R@5", "t2i/R@5", "sugarcrepe_style/swap_att", "sugarcrepe_style/swap_obj",
           "sugarcrepe_style/replace_att", "sugarcrepe_style/replace_obj", "sugarcrepe_style/replace_rel",
           "phrase_swaps/swap_att", "phrase_swaps/swap_obj")
_SHOWN = ("i2t/R@1", "t2i/R@1", "sugarcrepe_style/swap_att", "sugarcrepe_style/swap_obj")


def load_top(path: Path) -> TowersTop:
    return TowersTop(load_towers_checkpoint(path).eval())


def arm_train_config(config: TopsStudyConfig, arm: str, seed: int, n_images: int, output: Path) -> TrainConfig:
    """The `TrainConfig` of one fine-tune: the study's `finetune` settings, editor and local edits, then `arm`'s
    switches (`lace.experiment.variants`)."""
    finetune = config.finetune
    base = finetune.train_config(model="lace-towers", output=str(output), overwrite=True, seed=seed,
                                 batch_size=min(finetune.batch_size, n_images), vocabulary=config.vocabulary,
                                 checkpoint_every=0, keep_checkpoints=1)
    base = with_changes(base, {"log_every": 1})
    return variant_config(base, arm)


class ArmSources:
    """What the arms draw negatives from, each made the first time an arm that needs it trains."""

    def __init__(self, config: TopsStudyConfig, out: Path, cache: str, splits: dict[str, TopSplit],
                 finetune_split: TopSplit, captions: list[str], dictionary_stage, log):
        self.config, self.out, self.cache, self.splits, self.log = config, out, cache, splits, log
        self.finetune_split, self.captions, self.dictionary_stage = finetune_split, captions, dictionary_stage
        vocabulary = load_vocabulary(config.vocabulary)
        self.rules = RuleNegatives(vocabulary, config.finetune.negatives.rule_negative_kinds)  # the training negatives' kinds
        self.items_rules = RuleNegatives(vocabulary)  # every kind, for the measured items
        self._negatives = self._editor = None
        self.map_editors: dict[str, tuple[MapEditor, dict]] = {}
        """Each map editor fitted so far and its figures, by its operator (`editor_kind`)."""

    def pairs(self, top: TowersTop) -> TopPairs:
        """The fine-tune images as `TopPairs` of `top`: the cached token states of one rule-made negative per caption,
        every caption's text, and `top`'s text tower below the cut for the captions its image edits describe."""
        if self._negatives is None:
            rows = self.finetune_split.caption_rows
            texts, valid = rule_negative_captions(self.rules, [self.captions[r] for r in rows])
            made = [text for text, ok in zip(texts, valid) if ok]
            negative_of_caption = np.full(len(self.captions), -1, dtype=np.int64)
            negative_of_caption[rows[valid]] = np.arange(len(made))
            states = cached_text_top_features(top.encoder, made, self.cache, progress=self.config.progress)
            self._negatives = (states, negative_of_caption, made)
        states, negative_of_caption, made = self._negatives
        split = self.finetune_split
        return TopPairs(split.image_maps, split.token_states, split.caption_rows, split.caption_image_index, states,
                        negative_of_caption, self.captions, made, partial(fresh_token_states, top.encoder))

    def editor(self):
        """The pooled LACE editor over the base's dictionary, with the study's editor knobs."""
        if self._editor is None:
            self.dictionary_stage()
            self._editor = build_editor(load_labelled_dictionary(self.out / "models" / "dictionary"), self.config.finetune.negatives.edit)
        return self._editor

    def map_editor(self, local: LocalEditConfig) -> tuple[MapEditor, dict]:
        """The map editor of `local`'s operator (the Gaussian transport, or the learnt recolouring fitted on the first
        `local.fit_images` training photographs) and its figures, fitted once per study."""
        kind = editor_kind(local)
        if kind not in self.map_editors:
            self.map_editors[kind] = fit_local_sources(self.splits["train"], self.splits["val"], self.captions,
                                                       load_vocabulary(self.config.vocabulary), self.config, self.log,
                                                       local)
        return self.map_editors[kind]

    def inputs(self, top: TowersTop, train_config: TrainConfig) -> dict:
        """The `lace.train.train` inputs of one fine-tune of `top`."""
        inputs = {"dataset": self.pairs(top), "encoder": top}
        if train_config.arm.uses_counterfactuals:
            inputs["editor"] = self.editor()
        if train_config.arm.local_image_negatives:
            inputs["local_editor"], _ = self.map_editor(train_config.negatives.local)
        return inputs


def editor_kind(local: LocalEditConfig) -> str:
    """Which map editor an arm's local edits use: `learnt` (the learnt recolouring) or `transport` (Gaussian)."""
    return "learnt" if local.operator == "learnt" else "transport"


def captions_per_image(split: TopSplit, captions: list[str]) -> list[list[str]]:
    return captions_by_image([captions[r] for r in split.caption_rows], split.caption_image_index,
                             len(split.image_maps))


def fit_local_sources(train: TopSplit, val: TopSplit, captions: list[str], vocabulary, config: TopsStudyConfig,
                      log=print, local: LocalEditConfig | None = None) -> tuple[MapEditor, dict]:
    """The map editor of the local group fitted on the training images, and its figures: the share of validation
    images with a valid edit per slot, the reader's fit, and the local codes' alignment. local: the arm's local
    edits (default: the fine-tune's); with operator learnt the operator is the learnt recolouring, fitted on the
    first `local.fit_images` training photographs (`cut_photographs`) with the editor's reader."""
    local = local or config.finetune.negatives.local
    started, group, n_edits = time.perf_counter(), local.group, local.n_edits
    mentions, names = group_mentions(vocabulary, group, captions_per_image(train, captions))
    maps = torch.from_numpy(np.asarray(train.image_maps))
    operator_fit = None
    if local.operator == "learnt":
        photographs = cut_photographs(config.data, "train", local.fit_images, names)
        operator_fit = partial(fit_cut_operator, photographs, config=local.learnt, seed=0)
    editor = fit_map_editor(maps, mentions, names, seed=0, operator_fit=operator_fit)
    shares = []
    for start in range(0, len(val.image_maps), 500):
        edits = editor.edit(torch.from_numpy(np.asarray(val.image_maps[start:start + 500])), n_edits)
        shares.append(edits.valid.float())
    valid = torch.cat(shares)
    codes = LocalConceptCodes(n_atoms=64, sparsity=4, random_state=0).fit(
        regions_of(maps[::4]).reshape(-1, maps.shape[1]))
    codes.label(editor.editor.reader, codes.transform(regions_of(maps)), mentions, names)
    figures = {"group": group, "concepts": names, "images_mentioning": mentions.sum(0).tolist(),
               "reader_mention_loss": editor.editor.reader.mention_loss_,
               "val_valid_share": {f"slot{m} ({kind})": float(valid[:, m].mean()) for m, kind in enumerate(edits.kinds)},
               "val_any_valid_share": float(valid.any(dim=1).float().mean()),
               "local_codes": {"fvu": codes.fvu(regions_of(maps[1::8])), **codes.summary()},
               "operator": editor_kind(local), "seconds": time.perf_counter() - started}
    if operator_fit is not None:
        learnt = editor.operator
        figures["learnt_operator"] = {**learnt.fit_figures_, "fit_images": len(photographs.raw),
                                      "pairs_learnt": int(learnt.network_.learnt_pairs.sum())}
    log(f"local editor ({group}, {editor_kind(local)}): valid share on val {figures['val_valid_share']} "
        f"({figures['seconds']:.0f}s)")
    return editor, figures


class SplitItems:
    """A split's SugarCrepe-style items and the cached token states of their negatives; and zero-shot, when asked."""

    def __init__(self, top: TowersTop, rules: RuleNegatives, split: TopSplit, captions: list[str], cache: str,
                 config: TopsStudyConfig):
        split_captions = [captions[r] for r in split.caption_rows]
        self.split = split
        self.items = sugarcrepe_style_items(rules, split_captions, split.caption_image_index, config.items_per_kind)
        self.states = cached_text_top_features(top.encoder, [item["negative_caption"] for item in self.items], cache,
                                               progress=config.progress)
        # swap items written independently of the rule editor, encoded as its items are (`phrase_swaps/<kind>`)
        self.phrase_items = independent_swap_items(rules, split_captions, split.caption_image_index,
                                                   config.items_per_kind)
        self.phrase_states = cached_text_top_features(
            top.encoder, [item["negative_caption"] for item in self.phrase_items], cache,
            progress=config.progress) if self.phrase_items else None
        self.config = config

    @torch.no_grad()
    def measure(self, top: TowersTop) -> dict:
        images, texts = embed_top_split(top, self.split)
        correct, figures = {}, {}
        for family, items, states in (("sugarcrepe_style", self.items, self.states),
                                      ("phrase_swaps", self.phrase_items, self.phrase_states)):
            if not items:
                continue
            negatives = encode_captions(top, states, np.arange(len(items)), chunk=512)
            correct.update({f"{family}/{kind}": right
                            for kind, right in item_correct(images, texts, negatives, items).items()})
            figures.update({f"{family}/{kind}": value
                            for kind, value in score_items(images, texts, negatives, items).items()})
        # and the user's image folder, where one is given, through the whole towers and this model's tops
        return {**recall_of(images, texts, self.split), **figures,
                "items": {name: right.astype(int).tolist() for name, right in correct.items()},
                **folder_zeroshot(top.encoder, "tops", self.config)}


def _dictionary_stage(runner: StageRunner, key: str, config: TopsStudyConfig, base: TowersTop, train: TopSplit,
                      captions: list[str], folder: Path, log) -> dict:
    def work() -> dict:
        images, texts = embed_top_split(base, train)
        features = SplitFeatures("train", images, texts, [captions[r] for r in train.caption_rows],
                                 train.caption_image_index, [""] * len(images))
        labelled = fit_dictionary(images, texts, features, dataclasses.replace(config.dictionary,
                                                                                vocabulary=config.vocabulary),
                                  folder, config.progress, log)
        figures = alignment_figures(labelled)
        return {k: figures[k] for k in ("quality", "tau_align", "aligned_atoms") if k in figures}

    return runner.run("dictionary", key, work)


# long: the study's stages in order (base, sources, every arm and seed trained and measured, the summary), each one
# cached call, so that it reads top to bottom
def run_tops_study(config: TopsStudyConfig, log=print) -> dict:
    """Run (or resume) the study; write `arms-<split>.json` and `arms-<split>.md` into `config.out`."""
    config.validate()
    out = prepare_study_folder(config.out, overwrite=False)
    atomic_write_json(out / MARKER, {"study": "flickr8k-tops", "data": str(config.data)})
    runner = StageRunner(out, log=log)
    cache = config.feature_cache or str(out / "features")
    dataset = read_flickr8k(config.data)
    captions = list(dataset.captions)
    splits = top_splits(config.data, cache, TowersDualEncoder().eval(), progress=config.progress)
    base_rows, rest_rows = base_images(len(splits["train"].image_maps), config.base_share)
    finetune_split = splits["train"].subset(rest_rows, "train-rest")
    data_key = stage_key(str(config.data), {n: (len(s.image_maps), len(s.caption_rows)) for n, s in splits.items()},
                         captions[:5])

    base_settings = config.base
    base_path = out / "models" / "base.safetensors"
    base_key = stage_key(data_key, config.base_share, dataclasses.asdict(base_settings))

    def base_stage() -> dict:
        top = TowersTop(TowersDualEncoder().eval())
        summary = heads_base(top, splits["train"].subset(base_rows, "train-base"), base_settings, config.progress)
        save_top_checkpoint(top, base_path)
        return {"train": summary, "checkpoint": str(base_path.relative_to(out)), "images": len(base_rows)}

    base = runner.run("base", base_key, base_stage)
    base_top = load_top(base_path)
    dictionary_key = stage_key(base_key, config_to_dict(config.dictionary), config.vocabulary)
    figures: dict = {}
    sources = ArmSources(config, out, cache, splits, finetune_split, captions,
                         lambda: figures.setdefault("dictionary", _dictionary_stage(
                             runner, dictionary_key, config, base_top, splits["train"], captions,
                             out / "models" / "dictionary", log)), log)
    measured = SplitItems(base_top, sources.items_rules, splits[config.split], captions, cache, config)
    measure_key = stage_key(config.split, config.items_per_kind, config.zeroshot_root, config.zeroshot_classnames,
                            config.zeroshot_templates, PHRASE_SWAPS_VERSION)
    figures_by_arm = {"base": [runner.run(f"{config.split}-base", stage_key(base_key, measure_key),
                                lambda: measured.measure(base_top))]}
    arms = _tops_arms(config, out, base_key, base_path, dictionary_key, len(finetune_split.image_maps), sources,
                      measured, measure_key)
    results = run_stages(runner, arms.stages(), workers=1)
    for run, run_figures in arms.results(results, config.split).items():
        log(f"{run.label}: {config.split} " + ", ".join(f"{k} {v:.3f}" for k, v in run_figures.items() if k in _SHOWN))
    figures_by_arm.update(by_arm(arms.results(results, config.split)))
    seconds = {arm: [trained["seconds"] for trained in runs_of_arm]
               for arm, runs_of_arm in by_arm(arms.results(results)).items()}
    figures.update(_local_editor_figures(runner, config, base_key, sources))
    metrics = METRICS + tuple(k for k in figures_by_arm["base"][0] if k.startswith("zeroshot/") and k.endswith("top1"))
    result = {"split": config.split, "arms": list(config.arms), "seeds": config.seeds,
              "config": config_to_dict(config), "base": base, "finetune_images": len(finetune_split.image_maps),
              "items": len(measured.items),
              "phrase_swap_items": dict(Counter(item["kind"] for item in measured.phrase_items)), **figures,
              "summary": summarise_over_seeds(figures_by_arm, metrics, seconds), "runs": figures_by_arm}
    atomic_write_json(out / f"arms-{config.split}.json", result)
    atomic_write_text(out / f"arms-{config.split}.md", arms_table(result))
    return result


def _local_editor_figures(runner: StageRunner, config: TopsStudyConfig, base_key: str,
                          sources: ArmSources) -> dict[str, dict]:
    """The figures of each map editor the study's local arms use (`local_editor`, `local_editor_learnt`), as cached
    stages (from the editor the arms trained with where it was fitted in this run)."""
    found: dict[str, dict] = {}
    for arm in config.arms:
        train_config = variant_config(config.finetune.train_config(), arm)
        if not train_config.arm.local_image_negatives:
            continue
        local, kind = train_config.negatives.local, editor_kind(train_config.negatives.local)
        name = "local_editor" if kind == "transport" else f"local_editor_{kind}"
        if name not in found:
            settings = config.finetune.negatives.local if kind == "transport" else local  # as keyed before learnt
            found[name] = runner.run(name.replace("_", "-"), stage_key(base_key, config_to_dict(settings)),
                                     lambda local=local: sources.map_editor(local)[1])
    return found


def _tops_arms(config: TopsStudyConfig, out: Path, base_key: str, base_path: Path, dictionary_key: str,
               n_images: int, sources: ArmSources, measured: SplitItems, measure_key: str) -> ArmStages:
    """Every arm and seed (every arm of a seed before the next seed: a stopped run still compares them) trained
    from the base and measured on the study's split."""
    train_configs = {run: arm_train_config(config, run.arm, run.seed, n_images, run.run_folder(out))
                     for run in runs(config.arms, range(config.seeds), seed_first=True)}

    def train_key(run: Run) -> str:
        train_config = train_configs[run]
        return stage_key(base_key, config_to_dict(with_changes(train_config, {"output": ""})),
                         dictionary_key if train_config.arm.uses_counterfactuals else None)

    def train(run: Run) -> dict:
        model, checkpoint = load_top(base_path), run.model_file(out, ".safetensors")
        summary = train_summary(train_configs[run], config.progress, **sources.inputs(model, train_configs[run]))
        save_top_checkpoint(model, checkpoint)
        return {**summary, "checkpoint": str(checkpoint.relative_to(out))}

    measure = Measure(lambda trained: stage_key(trained, measure_key),
                      lambda run: measured.measure(load_top(run.model_file(out, ".safetensors"))))
    return ArmStages(tuple(train_configs), "train", train_key, train, {config.split: measure})


def arms_table(result: dict) -> str:
    """A markdown table of every arm's mean ± std on the measured split, with the difference to plain; the swap
    items written independently apart, in a second table; and the targets of every LACE arm that ran."""
    summary, split = result["summary"], result["split"]
    lines = [f"Flickr8k tower tops, {split} split, mean ± sample std over seeds (n; a single run without ±)", "",
             _arms_rows(summary, TABLE_COLUMNS, seconds=True)]
    counts = result.get("phrase_swap_items")
    if counts:
        lines += ["", "Swap items written independently of the rule editor (`lace.study.phrase_swaps`: whole phrases "
                  "exchanged; items the rule editor can also write left out): "
                  + ", ".join(f"{kind} {n} items" for kind, n in counts.items()) + ".", "",
                  _arms_rows(summary, PHRASE_TABLE_COLUMNS)]
    for arm in (name for name in summary if name in LACE_ARMS):
        checks = target_checks(result.get("runs", {}), arm)
        if checks:
            lines += ["", f"The pre-registered Flickr8k targets for {arm} against plain:", ""]
            lines += [f"- {claims.describe(check)}" for check in checks]
    return "\n".join(lines) + "\n"


TABLE_COLUMNS = {"sugarcrepe_style/swap_att": "i2t swap-att", "sugarcrepe_style/swap_obj": "i2t swap-obj",
                 "sugarcrepe_style/replace_att": "i2t replace-att", "i2t/R@1": "R@1 i2t", "t2i/R@1": "R@1 t2i"}
PHRASE_TABLE_COLUMNS = {"phrase_swaps/swap_att": "i2t phrase swap-att", "phrase_swaps/swap_obj": "i2t phrase swap-obj"}
"""The arms table's columns (figure -> header) for the rule editor's items and for the independent swap items."""


def _arms_rows(summary: dict, columns: dict[str, str], seconds: bool = False) -> str:
    """One row per arm: each column's mean ± std (n), the first column's difference to plain and, with `seconds`,
    the mean training seconds."""
    first = next(iter(columns))
    plain = summary.get("plain", {}).get(first, {}).get("mean")
    header = ["arm", *columns.values(), f"{columns[first].removeprefix('i2t ')} − plain"] + ["train s"] * seconds
    rows = [[arm, *(mean_std(figures.get(column), show_n=True) for column in columns), _delta(figures, first, plain)]
            + [f"{figures['train_seconds']:.0f}" if "train_seconds" in figures else None] * seconds
            for arm, figures in summary.items()]
    return Table(header, rows).markdown()


def _delta(figures: dict, column: str, plain: float | None) -> str | None:
    return f"{100 * (figures[column]['mean'] - plain):+.1f} pts" if plain is not None and figures.get(
        column, {}).get("n") else None


LACE_ARMS = ROLES["as_specified"] + ROLES["best"]
"""The arms whose targets the table checks: LACE as specified and every arm the best LACE arm is chosen from."""

TOPS_TARGETS = tuple(
    claims.difference(f"{{best}} beats {{plain}} on i2t {kind}", f"sugarcrepe_style/{kind}", "best", "plain", ">")
    for kind in BINDING_KINDS) + tuple(
    claims.difference(f"{{best}} keeps {metric} within 2 points of {{plain}}", metric, "best", "plain", ">=", -0.02)
    for metric in ("i2t/R@1", "t2i/R@1"))
"""The pre-registered Flickr8k targets of a LACE arm against plain, on the measured split."""
PHRASE_SWAP_TARGETS = tuple(
    claims.difference(f"{{best}} beats {{plain}} on i2t {kind} written independently", f"phrase_swaps/{kind}", "best",
                      "plain", ">")
    for kind in BINDING_KINDS)
"""The binding targets again on the independently written swap items: checked where the runs hold them."""


def target_checks(runs: dict[str, list[dict]], arm: str = "LACE-local") -> list[claims.Verdict]:
    """The pre-registered Flickr8k targets of `arm` against plain (`TOPS_TARGETS`), each decided by a bootstrap
    interval over the items (where a run kept them, under `items`) and the seeds (`runs`: arm -> one figures dict
    per seed). Empty when either arm is missing."""
    if not runs.get(arm) or not runs.get("plain"):
        return []
    arms = dict.fromkeys(ROLE_NAMES) | {"plain": "plain", "best": arm}
    measured = {key for figures in runs["plain"] for key in figures}
    targets = TOPS_TARGETS + tuple(target for target in PHRASE_SWAP_TARGETS if target.figure in measured)
    return [claims.check(target, arms, claims.figures_samples(runs)) for target in targets]


__all__ = ["arm_train_config", "arms_table", "run_tops_study", "target_checks"]
