"""What a demo run would take on a quiet machine, estimated from its stages' CPU seconds (results.json).

On a shared machine wall seconds measure the neighbours; CPU seconds (`time.process_time` of each stage, all its
threads) move less, though they do grow when the machine runs many more threads than it has cores (1.3-2.1x per
fine-tune at a load of 18 on 2 cores): the estimate holds for a run on a lightly loaded machine. The stages of the
demo's own process (the world, the base, the dictionary, the base's measures, the report) run one after the other,
each taking its CPU seconds over the threads that process used (the world: its wall time, as its renderers are
other processes); the stages side by side (the fine-tunes and what follows them) share the run's workers: the
longer of their CPU seconds shared evenly and the longest single stage. Interpreter start and imports are not
stages and are not counted.
"""

from __future__ import annotations

PARENT_STAGES = ("world", "base", "dictionary", "edit_retrieval", "zeroshot base", "eval base", "report")
"""The stages of the demo's own process, for runs whose results.json does not name them (`machine.parent_stages`)."""


def quiet_wall_estimate(summary: dict) -> float:
    """Estimated wall seconds of demo run `summary` (its results.json) on an idle machine with the run's threads and
    workers (see the module's note)."""
    machine, cpu = summary.get("machine", {}), summary.get("cpu_seconds", {})
    threads, workers = max(1, machine.get("threads", 1)), max(1, machine.get("workers", 1))
    parent_names = set(machine.get("parent_stages", PARENT_STAGES)) | {"report"}
    parent = sum(wall if name == "world" else (cpu.get(name) or 0.0) / threads
                 for name, wall in summary["wall_seconds"].items() if name in parent_names)
    side = [cpu.get(name) or 0.0 for name in summary["wall_seconds"] if name not in parent_names]
    return parent + max(sum(side) / workers, max(side, default=0.0))
