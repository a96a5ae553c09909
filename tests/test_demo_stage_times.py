"""The quiet-machine estimate of a demo run, read from its results.json (`lace.demo.stage_times`)."""

import pytest

from lace.demo.report import _time_section
from lace.demo.stage_times import PARENT_STAGES, quiet_wall_estimate
from lace.report.document import Report


def summary(parent_stages=None, workers=2):
    wall = {"world": 6.0, "base": 70.0, "dictionary": 4.0, "finetune-a": 90.0, "finetune-b": 50.0, "eval-a": 8.0,
            "report": 0.5}
    cpu = {"world": 2.0, "base": 120.0, "dictionary": 6.0, "finetune-a": 50.0, "finetune-b": 40.0, "eval-a": 30.0,
           "report": 0.4}
    machine = {"threads": 2, "workers": workers, "cpus": 2}
    if parent_stages is not None:
        machine["parent_stages"] = parent_stages
    return {"wall_seconds": wall, "cpu_seconds": cpu, "machine": machine}


def test_parent_stages_run_in_turn_and_the_rest_share_the_workers():
    parent = 6.0 + (120.0 + 6.0 + 0.4) / 2  # the world by its wall time: its renderers are other processes
    assert quiet_wall_estimate(summary(["world", "base", "dictionary"])) == pytest.approx(parent + 120.0 / 2)
    # one worker does the side stages one after the other
    assert quiet_wall_estimate(summary(["world", "base", "dictionary"], workers=1)) == pytest.approx(parent + 120.0)
    # many workers: the longest side stage bounds it
    assert quiet_wall_estimate(summary(["world", "base", "dictionary"], workers=8)) == pytest.approx(parent + 50.0)
    # a stage the run did in its own process counts there (over its threads), not on the workers
    assert quiet_wall_estimate(summary(["world", "base", "dictionary", "eval-a"])) == pytest.approx(
        parent + 30.0 / 2 + 50.0)


def test_runs_that_do_not_name_their_parent_stages_use_the_demo_s_list():
    assert {"world", "base", "dictionary", "report"} <= set(PARENT_STAGES)
    assert quiet_wall_estimate(summary()) == quiet_wall_estimate(summary(["world", "base", "dictionary"]))


def test_the_report_s_footer_gives_every_stage_s_times_and_the_estimate(tmp_path):
    run = summary(["world", "base", "dictionary"])
    run["machine"].update(load_average_at_start=[0.5, 0.4, 0.3], load_average_at_end=[1.0, 0.8, 0.5])
    report = Report("demo")
    _time_section(report, run, tmp_path)
    text = report.markdown(tmp_path)
    for name, wall in run["wall_seconds"].items():
        assert f"| {name} | {wall:.1f} | {run['cpu_seconds'][name]:.1f} |" in text
    assert f"quiet machine with these threads and workers: {quiet_wall_estimate(run):.0f} s" in text
