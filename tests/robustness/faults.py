"""Fault injection for the robustness suite: a `lace` command killed with SIGKILL at a chosen point.

`run_killed` forks the test process (lace already imported, so a run costs no start-up) and runs
`lace.cli.main(argv)` in the child with a tripwire on one function: the n-th call sends SIGKILL to
the child itself, so nothing (no `finally`, no handler, no flush) runs after it, as with `kill -9`
(or SIGINT, as Ctrl-C sends it).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class KillPoint:
    """Kill at the `call`-th call (1-based) of `module.attribute` (e.g. `lace.io.os.replace`)."""

    module: str
    attribute: str
    call: int

    def __str__(self) -> str:
        return f"{self.module}.{self.attribute} call {self.call}"


def _child(argv: list[str], point: KillPoint, signum: int) -> None:
    owner = importlib.import_module(point.module)
    for part in point.attribute.split(".")[:-1]:
        owner = getattr(owner, part)
    name = point.attribute.split(".")[-1]
    original = getattr(owner, name)
    calls = 0

    def tripwire(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == point.call:
            os.kill(os.getpid(), signum)
        return original(*args, **kwargs)

    setattr(owner, name, tripwire)
    # Ctrl-C's default handling, as at a terminal, even when the test run was started in the
    # background (where the shell leaves SIGINT ignored and Python keeps it so)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(1)
    torch.manual_seed(0)  # what random weights a `--pretrained none` model gets
    from lace.cli import main

    code = main(argv)
    sys.stdout.flush()
    os._exit(code)


def run_killed(argv: list[str], point: KillPoint, signum: int = signal.SIGKILL) -> int:
    """Run `lace <argv>` in a forked child that sends itself `signum` at `point`; its exit code
    (-9 when SIGKILL killed it, 130 when `lace` stopped on SIGINT)."""
    process = multiprocessing.get_context("fork").Process(target=_child, args=(argv, point, signum))
    process.start()
    process.join(timeout=300)
    if process.is_alive():
        process.kill()
        raise AssertionError(f"lace {argv[0]} still running after 300 s (kill point {point})")
    return process.exitcode


def subprocess_env() -> dict[str, str]:
    """Environment for `python -m lace` children: this checkout's sources, one thread."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT), "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def lace_run_folder(folder: Path) -> Path:
    """`folder` with 24 images and their captions (pairs.csv) and a fitted dictionary (dictionary/): what the fault
    tests' LACE runs train on."""
    from tests.conftest import make_images
    from tests.test_train import COLOURS, vocabulary_dictionary

    names = make_images(folder / "images", 24)
    rows = [f"images/{n},a {COLOURS[i % 4]} square left of a {'circle' if i % 2 else 'star'}" for i, n in enumerate(names)]
    (folder / "pairs.csv").write_text("filepath,caption\n" + "\n".join(rows) + "\n")
    captions = [f"a {c} {s} left of a {c2} star" for c in COLOURS for s in ("circle", "square") for c2 in ("pink", "cyan")]
    dictionary, directions, _, _ = vocabulary_dictionary(3, captions, 16)
    dictionary.save(folder / "dictionary")
    directions.save(folder / "dictionary")
    return folder
