"""Cached stages: each stage's result is a JSON file, so a rerun resumes and reuses.

A stage is done when `<out>/stages/<name>.json` exists and its recorded key matches
the key of the inputs it was run with; otherwise it runs again. Results are written
atomically after the stage's own files, so a stage killed midway simply runs again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from lace.io import atomic_write_json


def stage_key(*parts: object) -> str:
    """A short hash of everything a stage's output depends on."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class StageRunner:
    """Runs named stages once per key, recording results, wall times and CPU times.

    CPU time is this process's user + system time over the stage, all its threads together
    (`time.process_time`): unlike wall time, other work on a shared machine barely moves it.
    """

    def __init__(self, out: Path, log: Callable[[str], None] = print):
        self.out = Path(out)
        self.log = log
        self.wall_times: dict[str, float] = {}
        self.cpu_times: dict[str, float | None] = {}
        self.reused: dict[str, bool] = {}

    def path(self, name: str) -> Path:
        return self.out / "stages" / f"{name}.json"

    def cached(self, name: str, key: str) -> dict | None:
        """The recorded result of `name` when it was run with `key` (its times recorded here), else None."""
        path = self.path(name)
        if not path.is_file():
            return None
        cached = json.loads(path.read_text())
        if cached.get("key") != key:
            return None
        self.wall_times[name] = cached["wall_seconds"]
        self.cpu_times[name] = cached.get("cpu_seconds")
        self.reused[name] = True
        return cached["result"]

    def run(self, name: str, key: str, work: Callable[[], dict]) -> dict:
        """Return `work()`'s result for `name`, from the cache when `key` matches."""
        result = self.cached(name, key)
        if result is not None:
            self.log(f"[{name}] reused ({self.wall_times[name]:.1f}s when run)")
            return result
        self.log(f"[{name}] running")
        start, cpu_start = time.perf_counter(), time.process_time()
        result = work()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        atomic_write_json(self.path(name), {"key": key, "wall_seconds": seconds, "cpu_seconds": cpu_seconds, "result": result})
        self.wall_times[name] = seconds
        self.cpu_times[name] = cpu_seconds
        self.reused[name] = False
        self.log(f"[{name}] done in {seconds:.1f}s ({cpu_seconds:.1f}s CPU)")
        return result

    def in_order(self, names: list[str]) -> None:
        """List the times of stages `names` in that order (after any others), whatever order they ran in."""
        for times in (self.wall_times, self.cpu_times, self.reused):
            for name in names:
                if name in times:
                    times[name] = times.pop(name)
