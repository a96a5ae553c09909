"""Everything measured on one model's test embeddings: retrieval, geometry, brittleness,
SugarCrepe-style items made from the test captions by the rule editor, and swap items written
independently of it (`lace.study.phrase_swaps`), reported apart as `phrase_swaps/<kind>`.

Rule-made captions are encoded by the locked text tower once (`TextFeatureBank`); each
model then only runs its text head on them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lace.edits.captions import RuleNegatives
from lace.encoders.towers import TowersDualEncoder
from lace.eval.brittleness import rule_edit_brittleness
from lace.eval.measure import MeasureConfig, MeasuredSplit, measure, register
from lace.eval.metrics import pairwise_correct
from lace.study.features import (
    BankTextEncoder,
    RecordingTextEncoder,
    SplitFeatures,
    TextFeatureBank,
)
from lace.study.heads import embed_split
from lace.study.phrase_swaps import draw_items, phrase_swap_items
from lace.study.zeroshot import class_embeddings

# SugarCrepe's file names for the rule kinds that have a counterpart there (it also has
# add_att / add_obj, which a replace-or-swap rule editor cannot make).
SUGARCREPE_KINDS = {
    "replace_att": "replace_attribute", "replace_obj": "replace_object", "replace_rel": "replace_relation",
    "swap_att": "swap_attributes", "swap_obj": "swap_objects",
}


def sugarcrepe_style_items(
    rules: RuleNegatives, captions: Sequence[str], caption_image_index: np.ndarray, per_kind: int, seed: int = 0,
) -> list[dict]:
    """Items `{"kind", "image", "caption", "caption_row", "negative_caption"}` per SugarCrepe kind (`draw_items`):
    for every caption the kind applies to, one negative drawn by the rule editor (rng seeded by kind and row); at
    most `per_kind` items per kind (seeded sample, caption order)."""

    def draw(name: str, caption: str, rng: random.Random) -> str | None:
        negative = rules.make(caption, SUGARCREPE_KINDS[name], rng)
        return negative if negative != caption else None

    return draw_items(SUGARCREPE_KINDS, captions, caption_image_index, per_kind, str(seed), draw)


def independent_swap_items(
    rules: RuleNegatives, captions: Sequence[str], caption_image_index: np.ndarray, per_kind: int, seed: int = 0,
) -> list[dict]:
    """The phrase writer's swap items (`phrase_swap_items`, same form as `sugarcrepe_style_items`) less any whose
    negative the rule editor can also write (any kind, `RuleNegatives.make_all`): no part of the training
    pipeline could have produced what is left."""

    made: dict[str, set[str]] = {}

    def rule_made(caption: str, negative: str) -> bool:
        if caption not in made:
            made[caption] = {text for texts in rules.make_all(caption).values() for text in texts}
        return negative in made[caption]

    return phrase_swap_items(captions, caption_image_index, per_kind, seed, exclude=rule_made)


@dataclass
class PhraseSwapSet:
    """The independent swap items of a split and the bank holding their negatives' tower features."""

    items: list[dict]
    bank: TextFeatureBank | None

    @classmethod
    def encode(cls, encoder: TowersDualEncoder, items: list[dict], cache_dir, progress: bool = False) -> PhraseSwapSet:
        texts = [item["negative_caption"] for item in items]
        return cls(items, TextFeatureBank(encoder, texts, cache_dir, progress=progress) if texts else None)


def rule_brittleness_texts(rules: RuleNegatives, test: SplitFeatures, max_captions: int, seed: int = 0) -> list[str]:
    """The edited captions `rule_edit_brittleness` will encode for `test` (its draws are seeded)."""
    recorder = RecordingTextEncoder(embed_dim=8)
    rule_edit_brittleness(recorder, torch.zeros(len(test.image_paths), 8), test.captions,
                          torch.zeros(len(test.captions), 8), test.caption_image_index, rules,
                          max_captions=max_captions, seed=seed)
    return recorder.texts


def item_correct(image_embeddings: torch.Tensor, text_embeddings: torch.Tensor, negative_embeddings: torch.Tensor,
                 items: Sequence[dict]) -> dict[str, np.ndarray]:
    """Per kind, (n_kind,) bool: s(image, caption) > s(image, negative) for each of its items, in item order."""
    if not items:
        return {}
    images = image_embeddings[[item["image"] for item in items]]
    true = (images * text_embeddings[[item["caption_row"] for item in items]]).sum(-1)
    false = (images * negative_embeddings).sum(-1)
    kinds = np.array([item["kind"] for item in items])
    return {kind: pairwise_correct(true[torch.from_numpy(kinds == kind)], false[torch.from_numpy(kinds == kind)])
            for kind in SUGARCREPE_KINDS if (kinds == kind).any()}


def score_items(image_embeddings: torch.Tensor, text_embeddings: torch.Tensor, negative_embeddings: torch.Tensor,
                items: Sequence[dict]) -> dict[str, float]:
    """Image->text accuracy per kind: s(image, caption) > s(image, negative) (`item_correct`); and the macro mean."""
    figures = {kind: float(right.mean()) for kind, right in
               item_correct(image_embeddings, text_embeddings, negative_embeddings, items).items()}
    if figures:
        figures["mean"] = float(np.mean(list(figures.values())))
    return figures


@torch.no_grad()
def measure_model(
    encoder: TowersDualEncoder,
    test: SplitFeatures,
    bank: TextFeatureBank,
    rules: RuleNegatives,
    items: Sequence[dict],
    editor=None,
    n_edits: int = 4,
    rule_captions: int = 1000,
    k: int = 10,
    zeroshot_task=None,
    zeroshot_prompts: TextFeatureBank | None = None,
    phrase_swaps: PhraseSwapSet | None = None,
) -> dict:
    """Figures of one model on `test`; flat names as `lace eval` writes them, plus
    `sugarcrepe_style/<kind>`, `nk/{i2t,t2i}` (the N_k of every gallery item), given the independent swap
    items `phrase_swaps/<kind>` and, given a `lace.study.zeroshot.CaptionTask` and the bank holding its prompts,
    `zeroshot/captions/*`."""
    images, texts = embed_split(encoder, test)
    negatives = encoder.head_text(bank.lookup([item["negative_caption"] for item in items])) if items else None
    measures = ("geometry", "rule_brittleness") + (("counterfactual_brittleness",) if editor is not None else ())
    phrase_items, phrase_negatives = [], None
    if phrase_swaps is not None and phrase_swaps.items:
        phrase_items = phrase_swaps.items
        phrase_negatives = encoder.head_text(phrase_swaps.bank.lookup([i["negative_caption"] for i in phrase_items]))
        measures += ("phrase_swaps",)
    split = MeasuredSplit(images, texts, test.caption_image_index, test.captions, BankTextEncoder(encoder, bank))
    classes = None
    if zeroshot_task is not None and zeroshot_task.classes:
        prompts = encoder.head_text(zeroshot_prompts.lookup(zeroshot_task.prompts()))  # (C * T, d)
        classes = class_embeddings(prompts, len(zeroshot_task.classes))
        measures += ("zeroshot",)
    return measure(split, MeasureConfig(measures + ("sugarcrepe_style", "n_k"), k=k, n_edits=n_edits,
                                        rule_captions=rule_captions, seed=0),
                   rules=rules, editor=editor, items=items, negatives=negatives, zeroshot_task=zeroshot_task,
                   zeroshot_classes=classes, phrase_items=phrase_items, phrase_negatives=phrase_negatives)


@register("sugarcrepe_style")
def _sugarcrepe_style(split: MeasuredSplit, config: MeasureConfig, inputs: dict) -> dict:
    """`sugarcrepe_style/<kind>`: image->text accuracy on input `items` against their `negatives` (N, d)."""
    scores = score_items(split.images, split.texts, inputs.get("negatives"), inputs.get("items") or [])
    return {f"sugarcrepe_style/{name}": value for name, value in scores.items()}


@register("phrase_swaps")
def _phrase_swaps(split: MeasuredSplit, config: MeasureConfig, inputs: dict) -> dict:
    """`phrase_swaps/<kind>`: image->text accuracy on the independent swap items against their negatives (N, d)."""
    scores = score_items(split.images, split.texts, inputs["phrase_negatives"], inputs["phrase_items"])
    return {f"phrase_swaps/{name}": value for name, value in scores.items()}
