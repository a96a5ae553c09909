"""One process of a faulted `lace` run, started by `torch.distributed.run` (or forked by `run_as_rank`, with
the environment torchrun would give it): runs `lace.cli.main(ARGS)` with a tripwire on `Trainer._micro_step`.

Usage: fault_worker.py RECORD_DIR FAULT ARGS...

FAULT is `none` or `<rank>:<call>:<action>`: in process `rank`, at its `call`-th micro-batch (1-based), and
only in the first attempt of a torchrun job (TORCHELASTIC_RESTART_COUNT 0), do `action`:
`SIGTERM`, `SIGUSR1`, `SIGKILL` (sent to this process), `parent-SIGTERM` (sent to the launcher, which passes
it on to every worker, as when a scheduler signals the job) or `hang` (sleep until killed).
Each process writes `RECORD_DIR/rank<r>.json`: its exit code and the step its trainer ended on.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

import lace.train.loop
from lace.cli import main
from tests.distributed_support import become_rank


def install(fault: str, rank: int, seen: dict) -> None:
    original = lace.train.loop.Trainer._micro_step
    calls = 0
    target_rank, call, action = fault.split(":") if fault != "none" else (-1, 0, "")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    def tripwire(self, *args, **kwargs):
        nonlocal calls
        seen["trainer"] = self
        calls += 1
        if first_attempt and rank == int(target_rank) and calls == int(call):
            if action == "hang":
                while True:
                    time.sleep(60)
            elif action.startswith("parent-"):
                os.kill(os.getppid(), getattr(signal, action.removeprefix("parent-")))
            else:
                os.kill(os.getpid(), getattr(signal, action))
        return original(self, *args, **kwargs)

    lace.train.loop.Trainer._micro_step = tripwire


def run(record_dir: str, fault: str, argv: list[str]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)
    seen: dict = {}
    install(fault, rank, seen)
    code = main(argv)
    trainer = seen.get("trainer")
    record = {"code": code, "step": trainer.step if trainer is not None else None,
              "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    Path(record_dir, f"rank{rank}.json").write_text(json.dumps(record))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_as_rank(rank: int, world_size: int, port: int, record_dir: str, fault: str, argv: list[str],
                logs: str) -> None:
    """`run` as process `rank` of `world_size` (in the environment torchrun gives a worker), its stdout and stderr
    written to `<logs>.out` and `<logs>.err`: the target of a process forked from the tests' fork server
    (`tests.distributed_support.forkserver`)."""
    become_rank(rank, world_size, port)
    for descriptor, suffix in ((1, ".out"), (2, ".err")):
        os.dup2(os.open(logs + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), descriptor)
    run(record_dir, fault, argv)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3:])
