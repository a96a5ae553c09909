"""One protocol for every proving ground: arms x seeds x (train, measure), each step a cached stage.

A ground (the demo, the locked-tower study, the tower-tops study) declares its runs (`Run`: an arm of
`lace.experiment.variants.VARIANTS` and a seed), what training a run depends on and does, and each measure
of a trained run; `ArmStages` turns that into the `Stage`s of `lace.experiment.parallel`, named one way,
and reads their results back by run, never by parsing a name:

    arms = ArmStages(runs(("plain", "LACE"), range(3)), "train", train_key, train,
                     {"val": Measure(lambda trained: stage_key(trained, "val"), measure)})
    results = run_stages(runner, arms.stages(), workers=1)
    figures = by_arm(arms.results(results, "val"))    # {"plain": [seed 0, 1, 2], "LACE": [...]}

On disk a run is `<arm folder>-seed<s>` (`Run.folder`): its stages `stages/<step>-<folder>.json`, its model
`models/finetune-<folder><suffix>` and its run folder `runs/<folder>`; in tables it is `<arm> seed <s>`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path

from lace.experiment.parallel import Stage


def arm_folder(arm: str) -> str:
    """The file name of arm `arm`: "LACE-local pairs + caption negatives" -> "LACE-local-pairs-plus-caption-negatives"
    (case kept; every run of characters other than letters and digits one "-")."""
    return re.sub(r"[^A-Za-z0-9]+", "-", arm.replace(" + ", " plus ")).strip("-")


@dataclass(frozen=True)
class Run:
    """One fine-tune of a ground: arm `arm` (a name of `VARIANTS`) trained with seed `seed`."""

    arm: str
    seed: int

    @property
    def label(self) -> str:
        """The run in tables and results: "LACE seed 0"."""
        return f"{self.arm} seed {self.seed}"

    @property
    def folder(self) -> str:
        """The run on disk: "LACE-seed0"."""
        return f"{arm_folder(self.arm)}-seed{self.seed}"

    def stage(self, step: str) -> str:
        """The name of the run's stage `step` ("train", "eval", ...): "train-LACE-seed0"."""
        return f"{step}-{self.folder}"

    def model_file(self, out: str | Path, suffix: str) -> Path:
        """The run's exported model in the ground's folder `out`: `models/finetune-<folder><suffix>`."""
        return Path(out) / "models" / f"finetune-{self.folder}{suffix}"

    def run_folder(self, out: str | Path) -> Path:
        """The trainer's run folder (config.json, metrics.jsonl) in the ground's folder `out`."""
        return Path(out) / "runs" / self.folder

    def record(self) -> dict:
        """The run as results.json carries it, so that readers need not parse its label."""
        return {"arm": self.arm, "seed": self.seed, "folder": self.folder}


def runs(arms: Iterable[str], seeds: Iterable[int], seed_first: bool = False) -> tuple[Run, ...]:
    """Every arm with every seed: arm by arm (each arm's seeds together), or with `seed_first` seed by seed (every
    arm of a seed before the next seed, so that a stopped ground still compares its arms)."""
    arms, seeds = tuple(arms), tuple(seeds)
    if seed_first:
        return tuple(Run(arm, seed) for seed in seeds for arm in arms)
    return tuple(Run(arm, seed) for arm in arms for seed in seeds)


@dataclass(frozen=True)
class Measure:
    """One measure of a trained run: its stage key from the run's training key, and its work."""

    key: Callable[[str], str]
    work: Callable[[Run], dict]


@dataclass(frozen=True)
class ArmStages:
    """A ground's arms x seeds x (train, measure) as cached stages.

    `train_key(run)`: everything the run's training depends on; `train(run)`: train it, return its summary.
    `measures`: by step name, each run's measures, each a stage after the run's training.
    """

    runs: tuple[Run, ...]
    train_step: str
    train_key: Callable[[Run], str]
    train: Callable[[Run], dict]
    measures: Mapping[str, Measure] = field(default_factory=dict)

    @cached_property
    def keys(self) -> dict[Run, str]:
        """The training key of every run."""
        return {run: self.train_key(run) for run in self.runs}

    def train_stage(self, run: Run) -> Stage:
        return Stage(run.stage(self.train_step), self.keys[run], partial(self.train, run))

    def measure_stages(self, run: Run, steps: Iterable[str] | None = None) -> list[Stage]:
        """The stages of `run`'s measures `steps` (default: every one, in the declared order)."""
        steps = tuple(self.measures) if steps is None else tuple(steps)
        return [Stage(run.stage(step), self.measures[step].key(self.keys[run]), partial(self.measures[step].work, run),
                      after=(run.stage(self.train_step),)) for step in steps]

    def stages(self) -> list[Stage]:
        """Run by run, its training and then its measures (the order one process runs them in)."""
        return [stage for run in self.runs for stage in (self.train_stage(run), *self.measure_stages(run))]

    def results(self, results: Mapping[str, dict], step: str | None = None) -> dict[Run, dict]:
        """Each run's result of `step` (default: its training) from `run_stages`' results by stage name."""
        return {run: results[run.stage(step or self.train_step)] for run in self.runs}


def by_arm(per_run: Mapping[Run, dict]) -> dict[str, list[dict]]:
    """Results by run as lists by arm, in the runs' order (each arm's list in seed order when the runs are)."""
    grouped: dict[str, list[dict]] = {}
    for run, result in per_run.items():
        grouped.setdefault(run.arm, []).append(result)
    return grouped


__all__ = ["ArmStages", "Measure", "Run", "arm_folder", "by_arm", "runs"]
