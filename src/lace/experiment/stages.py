"""Cached stages: each stage's result is a JSON file, so a rerun resumes and reuses.

A stage is done when `<out>/stages/<name>.json` exists and its recorded key matches
the key of the inputs it was run with; otherwise it runs again. Results are written
atomically after the stage's own files, so a stage killed midway simply runs again. Each record has a
SHA-256 manifest beside it (`<name>.manifest.json`, written after it), checked when it is read.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lace.io import atomic_write_json
from lace.manifest import entry_manifest, verify, write_manifest


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

    def cached(self, name: str, key: str, reused: bool = True) -> dict | None:
        """The recorded result of `name` when it was run with `key`, else None: reused (its times noted, a line
        logged), or with `reused` False the result another process recorded just now (its times noted as a run of
        this one)."""
        record = self._record(name, key)
        if record is None:
            return None
        self._note(name, record["wall_seconds"], record.get("cpu_seconds"), reused=reused)
        if reused:
            self.log(f"[{name}] reused ({record['wall_seconds']:.1f}s when run)")
        return record["result"]

    def done(self, name: str, key: str) -> bool:
        """Whether `name` is recorded for `key` (read only: nothing is noted or logged)."""
        return self._record(name, key) is not None

    def run(self, name: str, key: str, work: Callable[[], dict]) -> dict:
        """Return `work()`'s result for `name`, from the cache when `key` matches."""
        result = self.cached(name, key)
        if result is not None:
            return result
        result, seconds, cpu_seconds = self._timed_run(name, work)
        path = self.path(name)
        atomic_write_json(path, {"key": key, "wall_seconds": seconds, "cpu_seconds": cpu_seconds, "result": result})
        write_manifest(path.parent, (path.name,), name=entry_manifest(path).name)
        self._note(name, seconds, cpu_seconds, reused=False)
        return result

    def timed(self, name: str, work: Callable[[], None]) -> None:
        """Run `work()`, a step that caches nothing of its own (it prepares in memory what later stages share), and
        note its times under `name` beside the stages' (not being a stage, it is never reused)."""
        _, seconds, cpu_seconds = self._timed_run(name, work)
        self.wall_times[name], self.cpu_times[name] = seconds, cpu_seconds

    def _timed_run(self, name: str, work: Callable[[], Any]) -> tuple[Any, float, float]:
        """`work()`'s result with its wall and CPU seconds, logged as step `name`."""
        self.log(f"[{name}] running")
        start, cpu_start = time.perf_counter(), time.process_time()
        result = work()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        self.log(f"[{name}] done in {seconds:.1f}s ({cpu_seconds:.1f}s CPU)")
        return result, seconds, cpu_seconds

    def _record(self, name: str, key: str) -> dict | None:
        """The stage file of `name` when it was written for `key`, else None."""
        path = self.path(name)
        if not path.is_file():
            return None
        verify(path.parent, (path.name,), manifest=entry_manifest(path))
        record = json.loads(path.read_text())
        return record if record.get("key") == key else None

    def _note(self, name: str, wall_seconds: float, cpu_seconds: float | None, reused: bool) -> None:
        self.wall_times[name] = wall_seconds
        self.cpu_times[name] = cpu_seconds
        self.reused[name] = reused

    def in_order(self, names: list[str]) -> None:
        """List the times of stages `names` in that order (after any others), whatever order they ran in."""
        for times in (self.wall_times, self.cpu_times, self.reused):
            for name in names:
                if name in times:
                    times[name] = times.pop(name)
