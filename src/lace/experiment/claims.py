"""Targets as data, checked by one function with one spread convention, and written by one formatter.

A `Target` compares weighted figures of the arms playing some roles (`lace.experiment.variants.ROLES`), or a share of
a gap between them, with a threshold on one split. `check` says met or missed only when the bootstrap interval (over
items where runs kept per-item scores, and over runs where there are several) lies wholly on one side of the
threshold, else "not decided" with the items and runs it rests on. Spreads are sample stds (ddof 1): `spread`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lace.experiment.variants import ROLE_NAMES, ROLES, with_caption_negatives

RESAMPLES, LEVEL = 1000, 0.95
COMPARISONS = {">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less}


@dataclass(frozen=True)
class Target:
    """`text` (role names in braces become arm names), the `figure` compared, its `terms` ((role, weight) or
    (role, weight, figure)), the `comparison` and `threshold`, the `split`, and for a share the `denominator`."""

    text: str
    figure: str
    terms: tuple[tuple, ...]
    comparison: str = ">="
    threshold: float = 0.0
    split: str = "test"
    denominator: tuple[tuple, ...] = ()


def difference(text: str, figure: str, left: str, right: str, comparison: str = ">=", threshold: float = 0.0,
               split: str = "test") -> Target:
    """left - right on `figure` against `threshold`."""
    return Target(text, figure, ((left, 1.0), (right, -1.0)), comparison, threshold, split)


def gap_share(text: str, figure: str, arm: str, low: str, high: str, threshold: float, split: str = "test") -> Target:
    """(arm - low) / (high - low) >= threshold: the share of the gap from `low` to `high` that `arm` closes."""
    return Target(text, figure, ((arm, 1.0), (low, -1.0)), ">=", threshold, split, ((high, 1.0), (low, -1.0)))


@dataclass
class Run:
    """One model's figure; `items`: its (n,) per-item scores, whose mean the figure is, where they were kept."""

    value: float
    items: np.ndarray | None = None


Samples = Callable[[str, str, str], Sequence[Run]]
"""samples(arm, figure, split) -> every run of `arm` holding `figure` on `split` (empty: not measured)."""


def figures_samples(runs: Mapping[str, Sequence[Mapping]]) -> Samples:
    """samples(arm, figure, split) over one figures dict per run of each arm (`runs`, all of one split): every run
    holding the figure, with its per-item scores where the run kept them (under `items`)."""

    def samples(arm: str, figure: str, split: str) -> list[Run]:
        found = [(figures[figure], figures.get("items", {}).get(figure)) for figures in runs.get(arm, [])
                 if figures.get(figure) is not None]
        return [Run(float(value), None if items is None else np.asarray(items, dtype=float)) for value, items in found]

    return samples


@dataclass
class Verdict:
    """A checked target: status met, missed, not decided, not run or not measured; the estimate, its margin past
    the threshold (+ past, - short, in the compared quantity's units), its interval and what it rests on (`n`)."""

    text: str
    split: str
    status: str
    evidence: str
    estimate: float | None = None
    margin: float | None = None
    interval: tuple[float, float] | None = None
    n: str = ""

    met = property(lambda self: {"met": True, "missed": False}.get(self.status))

    def record(self) -> dict:
        """The verdict as results JSON holds it."""
        return {"text": self.text, "split": self.split, "met": self.met, "margin": self.margin,
                "evidence": self.evidence, "status": self.status, "estimate": self.estimate,
                "interval": [v if np.isfinite(v) else None for v in self.interval] if self.interval else None,
                "n": self.n}


def spread(values: Sequence[float]) -> float | None:
    """The sample standard deviation (ddof 1) of `values`; None for fewer than two."""
    return float(np.std(np.asarray(values, dtype=float), ddof=1)) if len(values) > 1 else None


def assign_roles(ran: Sequence[str], choose: Callable[[str, list[str]], str | None]) -> dict[str, str | None]:
    """Role -> the arm of `ran` playing it (None where none ran); `choose(role, candidates)` picks among several.
    `best_with_text_only` is the best arm's twin with rule-made caption negatives, where it ran."""
    arms: dict[str, str | None] = {}
    for role, names in ROLES.items():
        candidates = [arm for arm in names if arm in ran]
        arms[role] = candidates[0] if len(candidates) == 1 else choose(role, candidates) if candidates else None
    twin = with_caption_negatives(arms["best"]) if arms["best"] else None
    arms["best_with_text_only"] = twin if twin in ran else None
    return arms


def bootstrap_interval(terms: Sequence[tuple[float, str, Sequence[Run]]],
                       denominator: Sequence[tuple[float, str, Sequence[Run]]] = (), resamples: int = RESAMPLES,
                       level: float = LEVEL, seed: int = 0) -> tuple[float, float] | None:
    """The percentile interval of sum(weight * mean over runs) (divided by the denominator's sum where given; a
    resample whose denominator is not positive counts as -inf) over `resamples` draws of a seeded numpy Generator.

    Each term is (weight, key, runs): the runs of one key (one arm) are drawn with the same run indices, and items
    of one count with the same item indices (every arm answers the same items: a paired bootstrap). None when a term
    has neither per-item scores nor two runs."""
    rng = np.random.default_rng(seed)
    run_draws: dict[tuple[str, int], np.ndarray] = {}
    item_draws: dict[int, np.ndarray] = {}

    def draws(weight: float, key: str, runs: Sequence[Run]) -> np.ndarray | None:  # (resamples,)
        counts = {None if run.items is None else len(run.items) for run in runs}
        if None not in counts and len(counts) == 1:
            n = counts.pop()
            if n not in item_draws:
                item_draws[n] = rng.integers(0, n, (resamples, n))
            per_run = np.stack([np.asarray(run.items, dtype=float)[item_draws[n]].mean(1) for run in runs])
        elif len(runs) > 1:
            per_run = np.repeat(np.array([[run.value] for run in runs], dtype=float), resamples, axis=1)
        else:
            return None
        if len(runs) > 1:
            if (key, len(runs)) not in run_draws:
                run_draws[key, len(runs)] = rng.integers(0, len(runs), (resamples, len(runs)))
            per_run = per_run[run_draws[key, len(runs)].T, np.arange(resamples)]  # (R, resamples)
        return weight * per_run.mean(0)

    parts = [[draws(*term) for term in group] for group in (terms, denominator)]
    if any(part is None for group in parts for part in group):
        return None
    values = np.sum(parts[0], axis=0)
    if denominator:
        below = np.sum(parts[1], axis=0)
        values = np.where(below > 0, values / np.where(below > 0, below, 1.0), -np.inf)
    with np.errstate(invalid="ignore"):  # -inf between two -inf resamples is -inf, not nan
        low, high = np.nan_to_num(np.quantile(values, [(1 - level) / 2, (1 + level) / 2]), nan=-np.inf, neginf=-np.inf)
    return float(low), float(high)


def check(target: Target, arms: Mapping[str, str | None], samples: Samples, resamples: int = RESAMPLES,
          level: float = LEVEL, seed: int = 0) -> Verdict:
    """`target` checked on the runs of the arms playing its roles (`assign_roles`)."""
    text = target.text.format(**{role: arms.get(role) or ROLE_NAMES[role] for role in ROLE_NAMES})
    groups = [[(role, weight, rest[0] if rest else target.figure) for role, weight, *rest in terms]
              for terms in (target.terms, target.denominator)]
    roles = list(dict.fromkeys(role for group in groups for role, _, _ in group))
    if any(arms.get(role) is None for role in roles):
        return Verdict(text, target.split, "not run", " or ".join(ROLE_NAMES[r] for r in roles if not arms.get(r))
                       + " not run")
    runs = {(role, figure): list(samples(arms[role], figure, target.split)) for group in groups
            for role, _, figure in group}
    lacking = [f"{figure} of {arms[role]}" for (role, figure), found in runs.items() if not found]
    if lacking:
        return Verdict(text, target.split, "not measured", "no " + ", no ".join(lacking))
    means = {key: float(np.mean([run.value for run in found])) for key, found in runs.items()}
    sums = [sum(weight * means[role, figure] for role, weight, figure in group) for group in groups]
    estimate = None if target.denominator and sums[1] <= 0 else sums[0] / (sums[1] if target.denominator else 1.0)
    terms = [[(weight, arms[role], runs[role, figure]) for role, weight, figure in group] for group in groups]
    interval = bootstrap_interval(terms[0], terms[1], resamples, level, seed)
    past = COMPARISONS[target.comparison]
    sides = None if interval is None else {bool(past(end, target.threshold)) for end in interval}
    status = ("missed" if estimate is None else "not decided" if sides is None or len(sides) == 2
              else "met" if sides == {True} else "missed")
    margin = None if estimate is None else (estimate - target.threshold) * (1 if ">" in target.comparison else -1)
    return Verdict(text, target.split, status, _evidence(groups, arms, means, sums, target), estimate, margin,
                   interval, _count(runs.values()))


def _evidence(groups, arms, means, sums, target: Target) -> str:
    """The figures behind a verdict: "a x vs b y (+d)" for a difference, the share of the gap for a share."""
    named = [(f"{arms[role]}" + (f" {figure}" if figure != target.figure else ""), means[role, figure])
             for role, figure in dict.fromkeys((role, figure) for role, _, figure in groups[0] + groups[1])]
    if target.denominator:
        gap = (f"{sums[0] / sums[1]:.2f} of a {sums[1]:+.3f} gap" if sums[1] > 0
               else f"no gap to close ({sums[1]:+.3f})")
        return ", ".join(f"{name} {value:.3f}" for name, value in named) + ": " + gap
    if [weight for _, weight, _ in groups[0]] == [1.0, -1.0]:
        return f"{named[0][0]} {named[0][1]:.3f} vs {named[1][0]} {named[1][1]:.3f} ({sums[0]:+.3f})"
    return ", ".join(f"{name} {value:.3f}" for name, value in named) + (f" ({sums[0]:+.3f})" if len(named) > 1 else "")


def _count(found: Sequence[Sequence[Run]]) -> str:
    """"n = 30 items × 2 runs", the smallest counts over the terms."""
    runs = min(len(group) for group in found)
    items = [len(run.items) for group in found for run in group if run.items is not None]
    plural = "run" if runs == 1 else "runs"
    return f"n = {min(items)} items × {runs} {plural}" if items else f"n = {runs} {plural}"


def describe(verdict: Verdict, words: tuple[str, str] = ("met", "missed")) -> str:
    """One line: "met: text — evidence; 95% interval [lo, hi], n = …", with `words` for met and missed."""
    status = {"met": words[0], "missed": words[1]}.get(verdict.status, verdict.status)
    if verdict.status == "not decided":
        status += f" ({verdict.n})"
    detail = f"; {verdict.n}" if verdict.status in ("met", "missed") else ""
    if verdict.interval is not None:
        detail = f"; {LEVEL:.0%} interval [{verdict.interval[0]:+.3f}, {verdict.interval[1]:+.3f}], {verdict.n}"
    return f"{status}: {verdict.text} — {verdict.evidence}{detail}"

