"""The claims engine: targets as data, one checker with bootstrap intervals, one spread, arms picked by role."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lace.experiment.claims import (
    Run,
    Target,
    assign_roles,
    bootstrap_interval,
    check,
    describe,
    difference,
    gap_share,
    spread,
)
from lace.experiment.variants import ROLE_NAMES, VARIANTS, with_caption_negatives


def _items(share: float, n: int) -> np.ndarray:
    """n items, the first round(share * n) right."""
    right = round(share * n)
    return np.array([1.0] * right + [0.0] * (n - right))


def _samples(table: dict[str, list[Run]]):
    return lambda arm, figure, split: table.get(arm, [])


ARMS = dict.fromkeys(ROLE_NAMES) | {"best": "LACE-local pairs", "plain": "plain", "ceiling": "ceiling pairs"}


def test_a_target_is_met_missed_or_not_decided_by_its_interval_over_items():
    target = difference("{best} beats {plain} by >= 10 points", "swap", "best", "plain", ">=", 0.10)
    plain = [Run(0.5, _items(0.5, 400))]
    met = check(target, ARMS, _samples({"plain": plain, "LACE-local pairs": [Run(0.7, _items(0.7, 400))]}))
    assert met.status == "met" and met.met is True and met.interval[0] >= 0.10
    assert met.text == "LACE-local pairs beats plain by >= 10 points"
    assert met.estimate == pytest.approx(0.2) and met.margin == pytest.approx(0.1)
    missed = check(target, ARMS, _samples({"plain": plain, "LACE-local pairs": [Run(0.52, _items(0.52, 400))]}))
    assert missed.status == "missed" and missed.met is False and missed.interval[1] < 0.10
    # the same +0.12 on 30 items: the interval straddles the threshold, so no verdict
    small = check(target, ARMS, _samples({"plain": [Run(0.5, _items(0.5, 30))],
                                          "LACE-local pairs": [Run(0.62, _items(0.62, 30))]}))
    assert small.status == "not decided" and small.met is None and small.n == "n = 30 items × 1 run"
    assert describe(small).startswith("not decided (n = 30 items × 1 run): LACE-local pairs beats plain")
    assert describe(met, ("held", "did not hold")).startswith("held: ")
    assert "95% interval [" in describe(met)


def test_one_run_without_items_is_never_decided_and_missing_arms_say_why():
    target = difference("{best} lowers skew against {plain}", "skew", "best", "plain", "<")
    verdict = check(target, ARMS, _samples({"plain": [Run(1.2)], "LACE-local pairs": [Run(0.4)]}))
    assert verdict.status == "not decided" and verdict.interval is None and verdict.n == "n = 1 run"
    assert verdict.margin == pytest.approx(0.8)  # below the threshold by 0.8: the good side of "<"
    # several seeds without items: the interval is over seeds
    seeds = check(target, ARMS, _samples({"plain": [Run(1.2), Run(1.3), Run(1.25)],
                                          "LACE-local pairs": [Run(0.4), Run(0.5), Run(0.45)]}))
    assert seeds.status == "met" and seeds.n == "n = 3 runs"
    not_run = check(target, dict(ARMS, best=None), _samples({"plain": [Run(1.2)]}))
    assert not_run.status == "not run" and not_run.text == "the best LACE arm lowers skew against plain"
    not_measured = check(target, ARMS, _samples({"plain": [Run(1.2)]}))
    assert not_measured.status == "not measured" and "skew of LACE-local pairs" in not_measured.evidence


def test_a_share_of_a_gap_and_a_single_arm_against_a_level():
    target = gap_share("{best} closes >= 3/4 of the gap", "swap", "best", "plain", "ceiling", 0.75)
    runs = {"plain": [Run(0.60, _items(0.60, 500))], "LACE-local pairs": [Run(0.66, _items(0.66, 500))],
            "ceiling pairs": [Run(0.67, _items(0.67, 500))]}
    verdict = check(target, ARMS, _samples(runs))
    assert verdict.estimate == pytest.approx(0.06 / 0.07) and "0.86 of a +0.070 gap" in verdict.evidence
    below = check(target, ARMS, _samples(runs | {"ceiling pairs": [Run(0.55, _items(0.55, 500))]}))
    assert below.status == "missed" and below.estimate is None and "no gap to close" in below.evidence
    auc = Target("{best} probe AUC <= 0.65", "auc", (("best", 1.0),), "<=", 0.65)
    level = check(auc, ARMS, _samples({"LACE-local pairs": [Run(0.60), Run(0.62), Run(0.61)]}))
    assert level.status == "met" and level.margin == pytest.approx(0.04)


def test_bootstrap_matches_scipys_percentile_interval_and_is_seeded():
    rng = np.random.default_rng(3)
    items = (rng.random(300) < 0.4).astype(float)
    ours = bootstrap_interval([(1.0, "arm", [Run(float(items.mean()), items)])], resamples=4000)
    reference = stats.bootstrap((items,), np.mean, n_resamples=4000, method="percentile", random_state=0,
                                confidence_level=0.95).confidence_interval
    assert ours == pytest.approx((reference.low, reference.high), abs=0.01)
    # the normal approximation of a share's interval, as a second reference
    half = 1.96 * np.sqrt(items.mean() * (1 - items.mean()) / len(items))
    assert ours == pytest.approx((items.mean() - half, items.mean() + half), abs=0.01)
    assert bootstrap_interval([(1.0, "arm", [Run(0.4, items)])]) == bootstrap_interval([(1.0, "arm", [Run(0.4, items)])])
    constant = bootstrap_interval([(1.0, "a", [Run(1.0, np.ones(50))]), (-1.0, "b", [Run(0.0, np.zeros(50))])])
    assert constant == (1.0, 1.0)
    assert bootstrap_interval([(1.0, "a", [Run(0.3)])]) is None  # one run, no items: nothing to resample


def test_paired_items_narrow_the_interval_of_a_difference():
    rng = np.random.default_rng(0)
    shared = (rng.random(200) < 0.5).astype(float)
    better = shared.copy()
    better[np.flatnonzero(shared == 0)[:20]] = 1.0  # the same items, 20 more right
    paired = bootstrap_interval([(1.0, "a", [Run(better.mean(), better)]), (-1.0, "b", [Run(shared.mean(), shared)])])
    assert paired[0] > 0.0 and paired[1] - paired[0] < 0.1


def test_spread_is_the_sample_standard_deviation():
    assert spread([0.74, 0.76]) == pytest.approx(np.sqrt(2) * 0.01)
    assert spread([1.0, 2.0, 3.0, 4.0]) == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert spread([0.5]) is None


def test_roles_pick_arms_from_the_table_never_from_their_names():
    ran = ["plain", "caption negatives", "LACE", "LACE-local pairs", "LACE-local pairs + column",
           "LACE-local pairs + caption negatives", "ceiling pairs", "concept-arithmetic negatives"]
    asked = []

    def choose(role, candidates):
        asked.append((role, candidates))
        return candidates[-1]

    arms = assign_roles(ran, choose)
    assert arms["plain"] == "plain" and arms["text_only"] == "caption negatives" and arms["as_specified"] == "LACE"
    # "LACE-local pairs + caption negatives" holds "pairs" in its name but is no candidate for the best arm
    assert asked == [("best", ["LACE-local pairs", "LACE-local pairs + column"])]
    assert arms["best"] == "LACE-local pairs + column" and arms["ceiling"] == "ceiling pairs"
    assert arms["best_with_text_only"] is None  # its twin with caption negatives did not run
    assert assign_roles(ran, lambda role, candidates: candidates[0])["best_with_text_only"] == (
        "LACE-local pairs + caption negatives")
    twin = with_caption_negatives("LACE-local pairs")
    assert VARIANTS[twin] == {**VARIANTS["LACE-local pairs"], "caption_negatives": True}
