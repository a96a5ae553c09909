"""The demo's targets and claims as data (`lace.experiment.claims`), checked on its runs with arms picked by role:
the per-item scores each evaluation keeps (`items` beside `benchmarks`) give the bootstrap intervals over items."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np

from lace.demo.columns import BINDING_COLUMNS, GEOMETRY_COLUMNS, metric, variant_of
from lace.experiment.claims import Run, Verdict, assign_roles, check, difference, gap_share

FIGURES = {column[0]: column for column in BINDING_COLUMNS + GEOMETRY_COLUMNS}


def runs_of(evaluations: dict, variant: str, figure: str, split: str) -> list[Run]:
    """The runs of `variant` holding `figure` (a column name) on `split`, each with its per-item scores where the
    evaluation kept them (`items` beside `benchmarks`)."""
    column = FIGURES[figure]
    runs = []
    for model, results in evaluations.items():
        value = metric(results[split], column) if variant_of(model) == variant and split in results else None
        if value is not None:
            items = results[split].get("items", {}).get(column[2] or column[1], {}).get(column[3])
            runs.append(Run(value, None if items is None else np.asarray(items, dtype=float)))
    return runs


SELECTION_COLUMNS = ("i2t swap-att", "t2i swap-att")
"""The validation figures whose mean picks the best LACE arm."""


def choose_by_figures(mean: Callable[[str, str, str], float | None]) -> Callable[[str, list[str]], str | None]:
    """choose(role, candidates): the best LACE arm by the validation mean of `SELECTION_COLUMNS`, the ceiling by
    test t2i swap-att (the harder reference); `mean(variant, figure, split)`."""

    def choose(role: str, candidates: list[str]) -> str | None:
        columns, split = (SELECTION_COLUMNS, "val") if role == "best" else (("t2i swap-att",), "test")
        scores = {arm: [mean(arm, column, split) for column in columns] for arm in candidates}
        scores = {arm: float(np.mean(values)) for arm, values in scores.items() if None not in values}
        return max(scores, key=scores.get) if scores else None

    return choose


def demo_roles(evaluations: dict) -> dict[str, str | None]:
    """Role -> the variant of `evaluations` playing it (`assign_roles`, choosing by `choose_by_figures`)."""
    def mean(variant: str, figure: str, split: str) -> float | None:
        runs = runs_of(evaluations, variant, figure, split)
        return float(np.mean([run.value for run in runs])) if runs else None

    return assign_roles(list(dict.fromkeys(variant_of(model) for model in evaluations)), choose_by_figures(mean))


def check_targets(evaluations: dict, targets, split: str | None = None) -> list[Verdict]:
    """`targets` (`lace.experiment.claims.Target`) checked on the demo's runs, arms picked by role."""
    arms, samples = demo_roles(evaluations), partial(runs_of, evaluations)
    return [check(replace(target, split=split) if split else target, arms, samples) for target in targets]


BINDING_TARGETS = tuple(
    difference(f"{{best}} beats {{plain}} by >= 10 points on {column}", column, "best", "plain", ">=", 0.10)
    for column in ("i2t swap-att", "t2i swap-att", "i2t swap-obj", "t2i swap-obj")) + (
    difference("{best} >= {text_only} on text->image swap-attribute", "t2i swap-att", "best", "text_only"),
    difference("{best_with_text_only} >= {text_only} + 5 points on text->image swap-attribute", "t2i swap-att",
               "best_with_text_only", "text_only", ">=", 0.05),
    difference("{best} keeps image->text R@1 within 2 points of {plain}", "R@1 i2t", "best", "plain", ">=", -0.02),
    difference("{best} keeps text->image R@1 within 2 points of {plain}", "R@1 t2i", "best", "plain", ">=", -0.02),
    difference("{best} raises Winoground group", "wino group", "best", "plain", ">"),
    gap_share("{best} closes >= 3/4 of the gap between {plain} and the ceiling on text->image swap-attribute",
              "t2i swap-att", "best", "plain", "ceiling", 0.75),
)
"""The targets of the best LACE arm (chosen on validation), on the in-distribution test split."""

CLAIMS = (
    difference("LACE beats plain by >= 15 points on image->text swap-attribute", "i2t swap-att", "as_specified",
               "plain", ">=", 0.15),
    difference("LACE beats plain by >= 15 points on text->image swap-attribute", "t2i swap-att", "as_specified",
               "plain", ">=", 0.15),
    difference("LACE beats caption negatives on text->image swap-attribute", "t2i swap-att", "as_specified",
               "text_only", ">"),
    difference("LACE keeps image->text R@1 within 2 points of plain", "R@1 i2t", "as_specified", "plain", ">=", -0.02),
    difference("LACE keeps text->image R@1 within 2 points of plain", "R@1 t2i", "as_specified", "plain", ">=", -0.02),
    difference("LACE lowers hubness skewness (captions' top-k of images)", "skew N10 t2i", "as_specified", "plain", "<"),
    difference("LACE lowers the one-way rate of images", "one-way img", "as_specified", "plain", "<"),
)
"""The method's expected effects for LACE as specified."""


def _both_ways(text: str, figure: str, left: str, right: str, comparison: str = ">", threshold: float = 0.0):
    """The target `text` on `figure` image->text and text->image ("{way}" and "{short}" become "image->text" and
    "i2t", then "text->image" and "t2i")."""
    return tuple(difference(text.replace("{way}", way), figure.replace("{short}", short), left, right, comparison,
                            threshold) for way, short in (("image->text", "i2t"), ("text->image", "t2i")))


STORY = (
    *_both_ways("{as_specified} (as the method specifies) beats {plain} on {way} swap-attribute", "{short} swap-att",
                "as_specified", "plain"),
    *_both_ways("{best} beats {plain} on {way} swap-attribute", "{short} swap-att", "best", "plain"),
    *_both_ways("{best} beats {text_only} on {way} swap-attribute", "{short} swap-att", "best", "text_only"),
    *_both_ways("{best_with_text_only} beats {text_only} on {way} swap-attribute", "{short} swap-att",
                "best_with_text_only", "text_only"),
    *_both_ways("{best} keeps {way} R@1 within 2 points of {plain}", "R@1 {short}", "best", "plain", ">=", -0.02),
    difference("{best} lowers hubness (skewness of images' N10 among captions' top-10) against {plain}",
               "skew N10 t2i", "best", "plain", "<"),
    difference("{best} lowers the share of one-way image neighbours against {plain}", "one-way img", "best",
               "plain", "<"),
    difference("{best} lowers brittleness to counterfactual edits against {plain}", "brittle cf", "best", "plain",
               "<"),
)
"""What the default demo's opening says, each checked in distribution (`test`) and on held-out colour-shape pairs
(`test_comp`): LACE as specified and the best LACE arm against plain, the best arm (alone and with caption negatives)
against caption negatives, and what the best arm does to retrieval, hubness, one-way neighbours and brittleness."""
STORY_SPLITS = {"test": "in distribution", "test_comp": "held-out colour-shape pairs"}
"""The splits of the opening, with their plain names."""


def story(evaluations: dict) -> dict[str, list[Verdict]]:
    """`STORY` checked on each split of `STORY_SPLITS`, arms picked by role."""
    return {split: check_targets(evaluations, STORY, split) for split in STORY_SPLITS}


def binding_targets(evaluations: dict, split: str = "test") -> list[Verdict]:
    """The targets of the best LACE arm, each checked (`BINDING_TARGETS`)."""
    return check_targets(evaluations, BINDING_TARGETS, split)


def claims(evaluations: dict, split: str = "test") -> list[Verdict]:
    """The method's expected effects, each checked against the numbers (`CLAIMS`)."""
    return check_targets(evaluations, CLAIMS, split)


VERDICT_NOTE = ("A verdict is given only when the 95% bootstrap interval of the compared quantity (resampling test "
                "items, and seeds where there are several) lies wholly on one side of the threshold; otherwise the "
                "claim is 'not decided', with the items and runs it rests on.")


