"""The one protocol of every proving ground: runs named one way, arms x seeds x (train, measure) as cached stages."""

from __future__ import annotations

import re

import pytest

from lace.config import refuse_set_fields
from lace.errors import LaceInputError
from lace.experiment.parallel import run_stages
from lace.experiment.protocol import (
    ArmStages,
    Measure,
    Run,
    arm_folder,
    by_arm,
    runs,
)
from lace.experiment.stages import StageRunner, stage_key
from lace.experiment.variants import VARIANTS
from lace.study.config import TOP_ARMS
from lace.train.config import ArmConfig, train_config


def test_a_run_has_one_label_one_folder_and_stage_names_from_it(tmp_path):
    run = Run("LACE-local pairs + caption negatives", 1)
    assert run.label == "LACE-local pairs + caption negatives seed 1"
    assert run.folder == "LACE-local-pairs-plus-caption-negatives-seed1"
    assert run.stage("train") == "train-LACE-local-pairs-plus-caption-negatives-seed1"
    assert run.model_file(tmp_path, ".pt") == tmp_path / "models" / f"finetune-{run.folder}.pt"
    assert run.run_folder(tmp_path) == tmp_path / "runs" / run.folder
    assert run.record() == {"arm": run.arm, "seed": 1, "folder": run.folder}


def test_every_arm_has_a_folder_of_its_own_and_the_tops_study_keeps_its_names():
    folders = {arm: arm_folder(arm) for arm in VARIANTS}
    assert len(set(folders.values())) == len(folders)
    assert all(re.fullmatch(r"[A-Za-z0-9]+(-[A-Za-z0-9]+)*", folder) for folder in folders.values())
    assert folders["ceiling (rendered swaps)"] == "ceiling-rendered-swaps"
    # the tower-tops study named its stages and checkpoints so before: its cached runs stay found (the arms with local
    # knobs of their own, symmetric and learnt, came to the tops after the names changed)
    for arm in (arm for arm in TOP_ARMS if not VARIANTS[arm].get("local")):
        assert folders[arm] == arm.replace(" + ", "-plus-").replace(" ", "-")


def test_runs_go_arm_by_arm_or_seed_by_seed():
    assert runs(("a", "b"), range(2)) == (Run("a", 0), Run("a", 1), Run("b", 0), Run("b", 1))
    assert runs(("a", "b"), (5, 6), seed_first=True) == (Run("a", 5), Run("b", 5), Run("a", 6), Run("b", 6))


def test_a_variant_sets_fields_of_the_arm_part_and_nothing_a_grounds_user_sets_but_an_editor_knob():
    """The grounds leave the arm part out of what their users set: a variant's row must stay inside it (an editor's
    knob, such as the edit kinds of LACE without rebind or the local editor's operator and symmetric kind, is the
    one nested change a row may make)."""
    arm_fields = set(ArmConfig.__dataclass_fields__)
    for name, changes in VARIANTS.items():
        switches = {key for key, value in changes.items() if not isinstance(value, dict)}
        assert switches <= arm_fields, name
        assert {key for key, value in changes.items() if isinstance(value, dict)} <= {"edit", "local"}, name
    assert {"counterfactual_captions", "local_image_negatives", "edited_rows_train_text"} <= arm_fields


def _toy_arms(calls: list[str], base: str = "base") -> ArmStages:
    """Two arms x two seeds whose training and measuring note their calls."""

    def train(run: Run) -> dict:
        calls.append(run.stage("train"))
        return {"trained": run.label, "seed": run.seed}

    def measure(run: Run) -> dict:
        calls.append(run.stage("val"))
        return {"score": 10 * run.seed + len(run.arm)}

    return ArmStages(runs(("plain", "LACE"), range(2)), "train", lambda run: stage_key(base, run.arm, run.seed), train,
                     {"val": Measure(lambda trained: stage_key(trained, "val"), measure)})


def test_arm_stages_train_then_measure_each_run_and_read_results_back_by_run(tmp_path):
    calls: list[str] = []
    arms = _toy_arms(calls)
    stages = arms.stages()
    assert [stage.name for stage in stages] == [name for run in arms.runs for name in (run.stage("train"),
                                                                                       run.stage("val"))]
    assert all(stage.after == (stage.name.replace("val-", "train-"),) for stage in stages[1::2])
    assert stages[1].key == stage_key(stages[0].key, "val")
    results = run_stages(StageRunner(tmp_path, log=lambda _: None), stages, workers=1)
    assert calls == [stage.name for stage in stages]
    figures = arms.results(results, "val")
    assert figures[Run("LACE", 1)] == {"score": 14}
    assert arms.results(results)[Run("plain", 0)] == {"trained": "plain seed 0", "seed": 0}
    assert by_arm(figures) == {"plain": [{"score": 5}, {"score": 15}], "LACE": [{"score": 4}, {"score": 14}]}


def test_arm_stages_are_cached_by_key_and_rerun_when_training_changes(tmp_path):
    calls: list[str] = []
    runner = StageRunner(tmp_path, log=lambda _: None)
    first = run_stages(runner, _toy_arms(calls).stages(), workers=1)
    calls.clear()
    assert run_stages(runner, _toy_arms(calls).stages(), workers=1) == first and calls == []
    run_stages(runner, _toy_arms(calls, base="another base").stages(), workers=1)
    assert len(calls) == 8  # a new training key: every training and, keyed on it, every measure again


def test_measure_stages_of_chosen_steps_only(tmp_path):
    arms = _toy_arms([])
    assert arms.measure_stages(Run("plain", 0), ()) == []
    assert [stage.name for stage in arms.measure_stages(Run("plain", 0), ("val",))] == ["val-plain-seed0"]
    with pytest.raises(KeyError):
        arms.measure_stages(Run("plain", 0), ("test",))


def test_refuse_set_fields_names_the_ground_the_field_and_what_sets_it():
    default, given = train_config().run, train_config(seed=7).run
    refuse_set_fields("ground", "finetune", default, default, ("seed",), "the ground")
    with pytest.raises(LaceInputError, match=r"^ground: field 'finetune.seed': expected 0: the ground sets it "
                                             r"\(its seeds\) \(got 7\)$"):
        refuse_set_fields("ground", "finetune", given, default, ("model", "seed"), "the ground", "its seeds")
