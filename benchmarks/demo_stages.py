"""Where `lace demo`'s time goes, read from a finished run's results.json, and its wall time on a quiet machine.

The quiet-machine wall time is estimated from CPU seconds (`lace.demo.stage_times`, which the report's footer
also prints): the stages of the demo's own process one after the other on its threads, then the stages side by
side on the run's workers.

Usage: python benchmarks/demo_stages.py RUN [--before RUN]   (RUN: a demo run folder)
The table compares RUN with --before (e.g. a run of main); the last printed line is one JSON object:
vs_peer_ratio is the estimate over --before's, vs_floor_ratio the estimate over all CPU seconds shared
evenly over the machine's cores (1.0: no core ever idle).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lace.demo.stage_times import quiet_wall_estimate


def stage_times(summary: dict) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds by stage in run order, from a demo run's results.json."""
    cpu = summary["cpu_seconds"]
    return {name: (wall, cpu.get(name) or 0.0) for name, wall in summary["wall_seconds"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--before", type=Path, default=None)
    args = parser.parse_args()
    summary = json.loads((args.run / "results.json").read_text())
    before_summary = json.loads((args.before / "results.json").read_text()) if args.before else None
    after, machine = stage_times(summary), summary["machine"]
    before = stage_times(before_summary) if before_summary else {}
    print(f"{'stage':<82} {'before wall':>11} {'before CPU':>10} {'wall':>8} {'CPU':>8}")
    for name in dict.fromkeys([*before, *after]):
        cells = [f"{value:.1f}" if value is not None else "-" for value in
                 (*before.get(name, (None, None)), *after.get(name, (None, None)))]
        print(f"{name:<82} {cells[0]:>11} {cells[1]:>10} {cells[2]:>8} {cells[3]:>8}")
    estimate = quiet_wall_estimate(summary)
    before_estimate = quiet_wall_estimate(before_summary) if before_summary else None
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
