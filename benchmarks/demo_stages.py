"""Where `lace demo`'s time goes, read from a finished run's results.json, and its wall time on a quiet machine.

On a shared machine wall seconds measure the neighbours; CPU seconds (`time.process_time` of each stage,
all its threads) move less, but they do grow when the machine runs many more threads than it has cores
(1.3-2.1x per fine-tune at a load of 18 on 2 cores): the estimate holds for a run on a lightly loaded
machine. The quiet-machine wall time is estimated from CPU seconds: the stages of
the parent process (world, base, dictionary, the base's measures, report) one after the other, each
taking its CPU seconds over the threads the parent used (the world: its wall time, as its renderers are
other processes), then the stages side by side (the fine-tunes and what follows them) on the run's
workers: the longer of their CPU seconds shared evenly and the longest single stage.

Usage: python benchmarks/demo_stages.py RUN [--before RUN]   (RUN: a demo run folder)
The table compares RUN with --before (e.g. a run of main); the last printed line is one JSON object:
vs_peer_ratio is the estimate over --before's, vs_floor_ratio the estimate over all CPU seconds shared
evenly over the machine's cores (1.0: no core ever idle).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PARENT_STAGES = ("world", "base", "dictionary", "edit_retrieval", "zeroshot base", "eval base", "report")
"""The stages the demo runs in its own process, before (and, the report, after) the side-by-side ones."""


def stage_times(run: Path) -> tuple[dict[str, tuple[float, float]], dict]:
    """(wall, CPU) seconds by stage in run order, and the machine record of `run`'s results.json."""
    summary = json.loads((run / "results.json").read_text())
    cpu = summary["cpu_seconds"]
    return {name: (wall, cpu.get(name) or 0.0) for name, wall in summary["wall_seconds"].items()}, summary["machine"]


def quiet_estimate(times: dict[str, tuple[float, float]], machine: dict) -> float:
    """Estimated wall seconds on an idle machine with the run's threads and workers (see the module's note)."""
    threads, workers = max(1, machine["threads"]), max(1, machine["workers"])
    parent = sum(wall if name == "world" else cpu / threads
                 for name, (wall, cpu) in times.items() if name in PARENT_STAGES)
    side = [cpu for name, (_, cpu) in times.items() if name not in PARENT_STAGES]
    return parent + max(sum(side) / workers, max(side, default=0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--before", type=Path, default=None)
    args = parser.parse_args()
    after, machine = stage_times(args.run)
    before, before_machine = stage_times(args.before) if args.before else ({}, None)
    print(f"{'stage':<82} {'before wall':>11} {'before CPU':>10} {'wall':>8} {'CPU':>8}")
    for name in dict.fromkeys([*before, *after]):
        cells = [f"{value:.1f}" if value is not None else "-" for value in
                 (*before.get(name, (None, None)), *after.get(name, (None, None)))]
        print(f"{name:<82} {cells[0]:>11} {cells[1]:>10} {cells[2]:>8} {cells[3]:>8}")
    estimate = quiet_estimate(after, machine)
    before_estimate = quiet_estimate(before, before_machine) if before else None
    cpu_total = sum(cpu for _, cpu in after.values())
    floor = cpu_total / max(1, machine["cpus"])
    print(f"CPU seconds {cpu_total:.1f}; estimated quiet wall {estimate:.1f} s"
          + (f" (before: {before_estimate:.1f} s)" if before_estimate else "")
          + f"; measured wall before the report {machine['wall_seconds_before_report']:.1f} s at load "
            f"{machine['load_average_at_start']} -> {machine['load_average_at_end']}")
    print(json.dumps({
        "benchmark": "demo_stages", "run": args.run.name, "cpu_seconds": round(cpu_total, 1),
        "estimated_quiet_wall_s": round(estimate, 1),
        "measured_wall_s": round(machine["wall_seconds_before_report"] + after.get("report", (0.0, 0.0))[0], 1),
        "vs_peer_ratio": round(estimate / before_estimate, 3) if before_estimate else None,
        "vs_peer_ratio_meaning": "estimated quiet wall over --before's",
        "vs_floor_ratio": round(estimate / floor, 3),
        "vs_floor_ratio_meaning": "estimated quiet wall over all CPU seconds shared evenly over the cores",
        "peak_gb": None, "peak_gb_meaning": "not recorded by the demo (this script only reads results.json)"}))


if __name__ == "__main__":
    main()
