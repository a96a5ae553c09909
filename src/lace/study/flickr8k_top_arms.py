"""Every training arm on Flickr8k with the tops of the towers trainable, over seeds.

From the protocol's base (heads on half the training images, `lace.study.flickr8k_top`), each
arm fine-tunes the tops and heads on the other half with the same data order, steps and seed,
and is measured on one split: retrieval and SugarCrepe-style image->text items made by the rule
editor from that split's captions (swap-type items are the binding measure real photographs
allow; text->image swaps need counterfactual photographs, which only the world has).

    run_arms(data, cache, out, arms=["plain", "LACE-local"], finetune=TopTraining(...), seeds=3, split="val")

Each fine-tune is saved as a `lace-towers` checkpoint (`lace eval` loads it) and its figures as
`<out>/arms/<arm>-seed<k>.json`; a rerun reuses both and only measures what a split lacks, so the
test split is measured once, at the end, on the models chosen nothing on it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from lace.concepts.labelled import load_labelled_dictionary
from lace.concepts.vocabulary import load_vocabulary
from lace.data.flickr8k import read_flickr8k
from lace.edits import EditConfig, build_editor
from lace.edits.captions import RuleNegatives
from lace.encoders.towers.checkpoint import load_towers_checkpoint
from lace.encoders.towers.top import TowersTop, save_top_checkpoint
from lace.encoders.towers.top_features import cached_text_top_features, encode_captions
from lace.errors import LaceInputError
from lace.experiment.variants import check_variants
from lace.io import atomic_write_json, atomic_write_text, read_json
from lace.local.codes import LocalConceptCodes
from lace.local.editor import group_mentions
from lace.local.maps import fit_map_editor, regions_of
from lace.study.concept_atoms import alignment_figures, fit_dictionary
from lace.study.features import SplitFeatures, rule_negative_captions
from lace.study.flickr8k_top import base_images, recall_of, top_splits
from lace.study.measure import score_items, sugarcrepe_style_items
from lace.study.top_negatives import RuleStates, TopNegativeSources, top_arm
from lace.study.top_training import TopSplit, TopTraining, embed_top_split, train_top

TOP_ARMS = ("plain", "caption negatives", "LACE", "concept-arithmetic negatives", "paired-caption directions",
            "LACE-local", "LACE-local + caption negatives")
"""Every arm the tower tops can train, in the order the report lists them."""

BINDING_KINDS = ("swap_att", "swap_obj")


def arm_slug(arm: str) -> str:
    return arm.replace(" + ", "-plus-").replace(" ", "-")


def load_base(out: Path) -> TowersTop:
    path = out / "models" / "base.safetensors"
    if not path.is_file():
        raise LaceInputError(f"{path}: no base model; run `python -m lace.study.flickr8k_top protocol` "
                             "with the same --out first")
    return TowersTop(load_towers_checkpoint(path).eval())


def rule_states(top: TowersTop, rules: RuleNegatives, captions: list[str], rows: np.ndarray, cache: str) -> RuleStates:
    """One rule-made negative per caption of dataset rows `rows` (seeded per row), their token states cached."""
    texts, valid = rule_negative_captions(rules, [captions[r] for r in rows])
    made = [text for text, ok in zip(texts, valid) if ok]
    row_of_caption = np.full(len(captions), -1, dtype=np.int64)
    row_of_caption[rows[valid]] = np.arange(len(made))
    return RuleStates(cached_text_top_features(top.encoder, made, cache), row_of_caption)


def captions_per_image(split: TopSplit, captions: list[str]) -> list[list[str]]:
    grouped: list[list[str]] = [[] for _ in range(len(split.image_maps))]
    for row, owner in zip(split.caption_rows, split.caption_image_index):
        grouped[owner].append(captions[row])
    return grouped


def local_sources(train: TopSplit, val: TopSplit, captions: list[str], vocabulary, n_edits: int, seed: int = 0,
                  group: str = "colour", log=print) -> tuple[object, dict]:
    """The map editor of `group` fitted on the training images, and its figures: the share of validation
    images with a valid edit per slot, the reader's fit, and the local codes' alignment."""
    started = time.perf_counter()
    if not len(val.image_maps):
        raise LaceInputError("flickr8k tower-top arms: the validation split has no images to measure the local edits on")
    mentions, names = group_mentions(vocabulary, group, captions_per_image(train, captions))
    maps = torch.from_numpy(np.asarray(train.image_maps))
    editor = fit_map_editor(maps, mentions, names, seed=seed)
    shares = []
    for start in range(0, len(val.image_maps), 500):
        edits = editor.edit(torch.from_numpy(np.asarray(val.image_maps[start:start + 500])), n_edits)
        shares.append(edits.valid.float())
    valid = torch.cat(shares)
    codes = LocalConceptCodes(n_atoms=64, sparsity=4, random_state=seed).fit(
        regions_of(maps[::4]).reshape(-1, maps.shape[1]))
    train_codes = codes.transform(regions_of(maps))
    codes.label(editor.editor.reader, train_codes, mentions, names)
    figures = {"group": group, "concepts": names, "images_mentioning": mentions.sum(0).tolist(),
               "reader_mention_loss": editor.editor.reader.mention_loss_,
               "val_valid_share": {f"slot{m} ({kind})": float(valid[:, m].mean())
                                   for m, kind in enumerate(edits.kinds)},
               "val_any_valid_share": float(valid.any(dim=1).float().mean()),
               "local_codes": {"fvu": codes.fvu(regions_of(maps[1::8])), **codes.summary()},
               "seconds": time.perf_counter() - started}
    log(f"local editor ({group}): valid share on val {figures['val_valid_share']} ({figures['seconds']:.0f}s)")
    return editor, figures


def dictionary_sources(top: TowersTop, train: TopSplit, captions: list[str], vocabulary: str, folder: Path,
                       atoms: int, sparsity: int, seconds: float, log=print) -> tuple[object, dict]:
    """The pooled LACE editor: a concept dictionary fitted on the base's training embeddings (reused from
    `folder` when there), and its alignment figures."""
    if not folder.is_dir() or not any(folder.iterdir()):
        images, texts = embed_top_split(top, train)
        features = SplitFeatures("train", images, texts, [captions[r] for r in train.caption_rows],
                                 train.caption_image_index, [""] * len(images))
        fit_dictionary(images, texts, features, vocabulary, atoms, sparsity, seconds, folder, log=log)
    labelled = load_labelled_dictionary(folder)
    figures = alignment_figures(labelled)
    return build_editor(labelled, EditConfig()), {key: figures[key] for key in ("quality", "tau_align",
                                                                                 "aligned_atoms") if key in figures}


class SplitItems:
    """A split's SugarCrepe-style items and the cached token states of their negatives."""

    def __init__(self, top: TowersTop, rules: RuleNegatives, split: TopSplit, captions: list[str], cache: str,
                 per_kind: int = 1000):
        split_captions = [captions[r] for r in split.caption_rows]
        self.items = sugarcrepe_style_items(rules, split_captions, split.caption_image_index, per_kind)
        self.states = cached_text_top_features(top.encoder, [item["negative_caption"] for item in self.items], cache)

    @torch.no_grad()
    def measure(self, top: TowersTop, split: TopSplit) -> dict:
        images, texts = embed_top_split(top, split)
        negatives = encode_captions(top, self.states, np.arange(len(self.items)), chunk=512)
        figures = {f"sugarcrepe_style/{kind}": value for kind, value in score_items(images, texts, negatives,
                                                                                    self.items).items()}
        return {**recall_of(images, texts, split), **figures}


def run_arms(data: str, cache: str, out: str, arms: list[str], finetune: TopTraining, seeds: int, split: str,
             base_share: float = 0.5, n_edits: int = 4, local_n_edits: int = 2, vocabulary: str = "natural",
             atoms: int = 512, sparsity: int = 8, dictionary_seconds: float = 150.0, log=print) -> dict:
    """Fine-tune every arm of `arms` from the protocol's base for each seed; measure on `split`."""
    check_variants(arms, "flickr8k tower-top arms", "arms")
    switches = {arm: top_arm(arm) for arm in arms}
    out = Path(out)
    dataset = read_flickr8k(data)
    captions = list(dataset.captions)
    top = load_base(out)
    splits = top_splits(data, cache, top.encoder)
    _, rest_rows = base_images(len(splits["train"].image_maps), base_share)
    finetune_split = splits["train"].subset(rest_rows, "train-rest")
    words = load_vocabulary(vocabulary)
    rules = RuleNegatives(words)
    sources = TopNegativeSources(n_edits=n_edits, local_n_edits=local_n_edits)
    figures: dict = {}
    if any(s.uses_rule_captions for s in switches.values()):
        sources.rules = rule_states(top, rules, captions, finetune_split.caption_rows, cache)
        figures["rule_negatives"] = {"captions": len(finetune_split.caption_rows),
                                     "with_a_negative": int((sources.rules.row_of_caption >= 0).sum())}
    if any(s.uses_counterfactuals for s in switches.values()):
        sources.editor, figures["dictionary"] = dictionary_sources(
            top, splits["train"], captions, vocabulary, out / "models" / "dictionary", atoms, sparsity,
            dictionary_seconds, log)
    if any(s.local_image_negatives for s in switches.values()):
        sources.map_editor, figures["local_editor"] = local_sources(splits["train"], splits["val"], captions, words,
                                                                    local_n_edits, log=log)
    measured = SplitItems(top, rules, splits[split], captions, cache)
    runs = {"base": [_arm_run(out / "arms" / "base.json", split, None, lambda: (top, {}),
                              lambda model: measured.measure(model, splits[split]))]}
    for seed in range(seeds):  # every arm of a seed before the next seed: a stopped run still compares them
        for arm in arms:
            name = f"{arm_slug(arm)}-seed{seed}"
            checkpoint = out / "models" / f"finetune-{name}.safetensors"

            def train_arm(arm=arm, seed=seed, checkpoint=checkpoint) -> tuple[TowersTop, dict]:
                model = load_base(out)
                summary = train_top(model, finetune_split, finetune, seed, arm, sources)
                save_top_checkpoint(model, checkpoint)
                log(f"{arm} seed {seed}: trained {summary['steps']} steps in {summary['seconds']:.0f}s")
                return model, {"train": summary, "checkpoint": str(checkpoint.relative_to(out))}

            run = _arm_run(out / "arms" / f"{name}.json", split, checkpoint, train_arm,
                           lambda model: measured.measure(model, splits[split]))
            log(f"{arm} seed {seed}: {split} " + ", ".join(f"{k} {v:.3f}" for k, v in run[split].items()
                                                        if k in _SHOWN))
            runs.setdefault(arm, []).append(run)
    result = {"split": split, "arms": list(arms), "seeds": seeds, "finetune_settings": dataclasses.asdict(finetune),
              "finetune_images": len(finetune_split.image_maps), "items": len(measured.items), **figures,
              "summary": summarise(runs, split), "runs": runs}
    atomic_write_json(out / f"arms-{split}.json", result)
    atomic_write_text(out / f"arms-{split}.md", arms_table(result))
    return result


_SHOWN = ("i2t/R@1", "t2i/R@1", "sugarcrepe_style/swap_att", "sugarcrepe_style/swap_obj")


def _arm_run(path: Path, split: str, checkpoint: Path | None, train, measure) -> dict:
    """The record at `path`, measured on `split` when it is not yet: the model is read from `checkpoint`
    when there, else trained (`train() -> (model, record fields)`, which saves it)."""
    record = read_json(path) if path.is_file() else {}
    if split not in record:
        if checkpoint is not None and checkpoint.is_file():
            model = TowersTop(load_towers_checkpoint(checkpoint).eval())
        else:
            model, fields = train()
            record.update(fields)
        record[split] = measure(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, record)
    return record


METRICS = ("i2t/R@1", "t2i/R@1", "i2t/R@5", "t2i/R@5", "sugarcrepe_style/swap_att", "sugarcrepe_style/swap_obj",
           "sugarcrepe_style/replace_att", "sugarcrepe_style/replace_obj", "sugarcrepe_style/replace_rel")


def summarise(runs: dict[str, list[dict]], split: str) -> dict:
    """Mean, standard deviation (ddof 1) and n over seeds of each metric, per arm; training seconds."""
    summary = {}
    for arm, records in runs.items():
        values = {m: np.array([r[split][m] for r in records if m in r[split]], dtype=float) for m in METRICS}
        summary[arm] = {m: {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
                            "n": int(v.size)} for m, v in values.items() if v.size}
        seconds = [r["train"]["seconds"] for r in records if "train" in r]
        if seconds:
            summary[arm]["train_seconds"] = float(np.mean(seconds))
    return summary


def arms_table(result: dict) -> str:
    """A markdown table of every arm's mean ± std on the measured split, with the difference to plain."""
    summary, split = result["summary"], result["split"]
    columns = ("sugarcrepe_style/swap_att", "sugarcrepe_style/swap_obj", "sugarcrepe_style/replace_att",
               "i2t/R@1", "t2i/R@1")
    lines = [f"Flickr8k tower tops, {split} split, mean ± std over seeds (n)", "",
             ("| arm | i2t swap-att | i2t swap-obj | i2t replace-att | R@1 i2t | R@1 t2i | swap-att − plain | "
              "train s |"), "|---|---|---|---|---|---|---|---|"]
    plain = summary.get("plain", {}).get(columns[0], {}).get("mean")
    for arm, figures in summary.items():
        cells = [f"{figures[c]['mean']:.3f} ± {figures[c]['std']:.3f} ({figures[c]['n']})" if c in figures else "–"
                 for c in columns]
        delta = (f"{100 * (figures[columns[0]]['mean'] - plain):+.1f} pts"
                 if plain is not None and columns[0] in figures else "–")
        seconds = f"{figures['train_seconds']:.0f}" if "train_seconds" in figures else "–"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {delta} | {seconds} |")
    checks = target_checks(summary)
    if checks:
        lines += ["", "The issue's Flickr8k targets for LACE-local against plain:", ""]
        lines += [f"- {'met' if check['met'] else 'missed'}: {check['target']} ({check['measured']})"
                  for check in checks]
    return "\n".join(lines) + "\n"


def target_checks(summary: dict, arm: str = "LACE-local") -> list[dict]:
    """The pre-registered Flickr8k targets of `arm` against plain: on each swap-type family the gain over
    plain exceeds twice the seed spread (the larger standard deviation of the two arms); retrieval
    within 2 points of plain both ways. Empty when either arm is missing."""
    if arm not in summary or "plain" not in summary:
        return []
    ours, plain = summary[arm], summary["plain"]
    checks = []
    for kind in BINDING_KINDS:
        metric = f"sugarcrepe_style/{kind}"
        gain = ours[metric]["mean"] - plain[metric]["mean"]
        spread = max(ours[metric]["std"], plain[metric]["std"])
        checks.append({"target": f"{arm} − plain on i2t {kind} > 2 × seed spread", "met": gain > 2 * spread,
                       "measured": f"{100 * gain:+.1f} points, spread {100 * spread:.1f}"})
    for metric in ("i2t/R@1", "t2i/R@1"):
        gap = ours[metric]["mean"] - plain[metric]["mean"]
        checks.append({"target": f"{metric} within 2 points of plain", "met": gap >= -0.02,
                       "measured": f"{100 * gap:+.1f} points"})
    return checks


__all__ = ["TOP_ARMS", "arms_table", "run_arms", "summarise", "target_checks"]
