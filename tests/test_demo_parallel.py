"""Stages side by side in worker processes: the figures of one after the other, errors raised where they belong."""

import json
import os
from dataclasses import replace

import pytest

from lace.config import with_changes
from lace.demo import DemoConfig, run_demo
from lace.demo.config import DEMO_DICTIONARY, DEMO_FINETUNE
from lace.errors import LaceInputError
from lace.experiment.parallel import Preparation, Stage, StageFailed, run_stages
from lace.experiment.stages import StageRunner

# one thread in this process too, so that every stage runs with the thread count it has in a worker
TINY = DemoConfig(world_images=240, base_steps=6, batch_size=16,
                  dictionary=replace(DEMO_DICTIONARY, atoms=16, sparsity=3),
                  finetune=with_changes(DEMO_FINETUNE, {"steps": 3, "n_edits": 2}),
                  only_variants=("LACE",), threads=1, progress=False)
AFTER_THE_DICTIONARY = ("finetune", "eval", "zeroshot", "edit_grids", "wise_ft")
TIMINGS = {"wall_seconds", "cpu_seconds", "reused", "machine", "seconds", "samples_per_second"}


def _figures(value):
    """`value` without timings, the settings that say how it ran, or paths."""
    if isinstance(value, dict):
        return {key: _figures(item) for key, item in value.items() if key not in TIMINGS | {"config"}}
    if isinstance(value, list):
        return [_figures(item) for item in value]
    return value


@pytest.mark.slow
def test_stages_side_by_side_give_the_figures_of_one_after_the_other(tmp_path, wise_ft_at_two_alphas):
    one_by_one = run_demo(replace(TINY, jobs=1), tmp_path, log=lambda _: None)
    assert one_by_one["machine"]["workers"] == 1
    removed = set()
    for stage in (tmp_path / "stages").glob("*.json"):
        if stage.stem.startswith(AFTER_THE_DICTIONARY) and not stage.name.endswith(".manifest.json"):
            stage.unlink()
            removed.add(stage.stem)
    side_by_side = run_demo(replace(TINY, jobs=2), tmp_path, log=lambda _: None)
    assert side_by_side["machine"]["workers"] == 2
    rerun = [name for name, reused in side_by_side["reused"].items() if not reused]
    assert set(rerun) == removed and {"finetune-LACE-seed0", "eval-LACE-seed0", "wise_ft"} <= removed
    assert _figures(json.loads(json.dumps(side_by_side))) == _figures(json.loads(json.dumps(one_by_one)))
    # the report lists the stages in one order whichever finished first
    assert list(side_by_side["wall_seconds"]) == list(one_by_one["wall_seconds"])


def _runner(tmp_path) -> StageRunner:
    return StageRunner(tmp_path, log=lambda _: None)


def test_results_come_back_in_order_and_a_stage_waits_for_those_it_comes_after(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()

    def mark(name):
        (marks / name).write_text(str(os.getpid()))
        return {"name": name, "before": sorted(path.name for path in marks.iterdir())}

    stages = [Stage("a", "1", lambda: mark("a")), Stage("b", "1", lambda: mark("b")),
              Stage("c", "1", lambda: mark("c"), after=("a", "b"))]
    results = run_stages(_runner(tmp_path), stages, workers=2, progress=False)
    assert list(results) == ["a", "b", "c"]
    assert results["c"]["before"] == ["a", "b", "c"]
    assert int((marks / "a").read_text()) != os.getpid()  # it ran in a worker process
    again = _runner(tmp_path)
    assert run_stages(again, stages[:1] + [Stage("b", "2", lambda: mark("b2"))], workers=2, progress=False) == {
        "a": results["a"], "b": {"name": "b2", "before": ["a", "b", "b2", "c"]}}
    assert again.reused == {"a": True, "b": False}


def test_a_failing_stage_raises_its_error_here_and_later_stages_do_not_run(tmp_path):
    def fail():
        raise LaceInputError("world.json: field 'images': expected a list")

    stages = [Stage("bad", "1", fail), Stage("after bad", "1", lambda: {"ran": True}, after=("bad",))]
    with pytest.raises(LaceInputError, match="field 'images'") as raised:
        run_stages(_runner(tmp_path), stages, workers=2, progress=False)
    assert any("in the worker process of stage 'bad'" in note for note in raised.value.__notes__)
    assert not (tmp_path / "stages" / "after bad.json").exists()


def test_a_worker_that_dies_is_reported_by_its_stage(tmp_path):
    stages = [Stage("dies", "1", lambda: os._exit(3)), Stage("fine", "1", dict)]
    with pytest.raises(StageFailed, match="'dies'"):
        run_stages(_runner(tmp_path), stages, workers=2, progress=False)


def test_a_stage_listed_before_what_it_comes_after_is_refused(tmp_path):
    with pytest.raises(ValueError, match="listed before"):
        run_stages(_runner(tmp_path), [Stage("b", "1", dict, after=("a",)), Stage("a", "1", dict)], workers=2)


def test_an_error_that_cannot_travel_comes_back_as_its_text(tmp_path):
    class LocalError(Exception):  # a class defined in a function does not pickle
        pass

    def fail():
        raise LocalError("the atoms are not unit vectors")

    with pytest.raises(StageFailed, match="LocalError: the atoms are not unit vectors") as raised:
        run_stages(_runner(tmp_path), [Stage("odd", "1", fail)], workers=2, progress=False)
    assert any("Traceback" in note for note in raised.value.__notes__)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_preparation_runs_once_here_before_its_first_stage_and_not_when_they_are_cached(tmp_path, workers):
    shared: dict = {}
    calls = []

    def prepare():
        calls.append(os.getpid())
        shared["inputs"] = [1, 2, 3]

    preparation = Preparation("read inputs", prepare)
    stages = [Stage("train", "1", lambda: {"pid": os.getpid()}),
              Stage("eval a", "1", lambda: {"sum": sum(shared["inputs"])}, preparation=preparation),
              Stage("eval b", "1", lambda: {"count": len(shared["inputs"])}, preparation=preparation)]
    runner = _runner(tmp_path)
    results = run_stages(runner, stages, workers=workers, progress=False)
    assert results["eval a"] == {"sum": 6} and results["eval b"] == {"count": 3}  # the workers saw what it made
    assert calls == [os.getpid()]  # once, in this process
    assert list(runner.wall_times) == ["train", "read inputs", "eval a", "eval b"]
    assert "read inputs" not in runner.reused and runner.cpu_times["read inputs"] >= 0
    again = _runner(tmp_path)
    assert run_stages(again, stages, workers=workers, progress=False) == results
    assert calls == [os.getpid()] and "read inputs" not in again.wall_times  # every stage cached: not prepared
