"""A process of a data-parallel run that dies or stops answering: the others end, naming it and the step.

Every collective waits at most the process group's timeout (`TrainConfig.dist_timeout`, `--dist-timeout`).
A collective that fails (a peer closed its connection: it died; or no reply within the timeout: it hangs)
raises in each process still running. `WatchCollectives` turns that error into `LostProcess`: the process
records in the job's key-value store that it is still there, waits up to one more timeout for the others to
do the same (at most the timeout, and at most 30 s), and names those that never do. A run therefore ends
within the timeout plus at most 30 s of the moment a process was lost. No checkpoint is written after the loss, so `latest` stays on the last whole
checkpoint, where a restarted job (`--resume latest` or `--resume auto`) carries on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Self

import torch.distributed as dist

from lace.distributed import DistributedContext

LOST_PROCESS_EXIT = 69
"""Exit status when another process of the run was lost (`EX_UNAVAILABLE` of sysexits.h); resumable."""
POLL_SECONDS = 0.2
REPORT_SECONDS = 30.0
"""The longest a process waits for the others to report as alive (at most the timeout itself)."""


class LostProcess(RuntimeError):
    """Another process of the run died or stopped answering during `step`; `ranks` are the ones that did not
    report (empty when they could not be told apart)."""

    exit_code = LOST_PROCESS_EXIT

    def __init__(self, message: str, ranks: list[int], step: int):
        super().__init__(message)
        self.ranks, self.step = ranks, step


def is_collective_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that failed because of another process (gloo's and NCCL's errors)."""
    text = str(error)
    return isinstance(error, getattr(dist, "DistError", ())) or any(
        mark in text for mark in ("gloo", "NCCL", "Connection closed by peer", "Connection reset by peer",
                                  "Timed out waiting", "timed out"))


class WatchCollectives:
    """Context manager around a run's steps: a failed collective becomes `LostProcess` naming the lost ranks.

    Set `step` to the step being worked on; `checkpoint` to the latest whole checkpoint (for the message).
    """

    def __init__(self, context: DistributedContext, timeout: float):
        self.context, self.timeout = context, float(timeout)
        self.step = 0
        self.checkpoint: Path | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or not self.context.enabled or isinstance(error, LostProcess) \
                or not isinstance(error, RuntimeError) or not is_collective_failure(error):
            return False
        raise self.lost(error) from error

    def lost(self, error: BaseException) -> LostProcess:
        """Report this process as alive in the store, wait for the others, and describe who is missing."""
        ranks = self._missing_ranks()
        rank, world = self.context.rank, self.context.world_size
        if ranks:
            who = ", ".join(f"rank {r}" for r in ranks)
            what = f"{who} of {world} died or stopped answering at step {self.step}"
        else:
            what = f"a process of {world} died or stopped answering at step {self.step}"
        kept = (f"the latest whole checkpoint is {self.checkpoint.stem} in {self.checkpoint.parent}"
                if self.checkpoint is not None else "no checkpoint was written yet")
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        message = (f"{what} (seen by rank {rank}; collectives wait {self.timeout:g} s, --dist-timeout); nothing "
                   f"of step {self.step} was saved and {kept}; restart the job with --resume latest (or run it "
                   f"with --resume auto under torchrun --max-restarts) [{first_line[:300]}]")
        return LostProcess(message, ranks, self.step)

    def _missing_ranks(self) -> list[int]:
        """Ranks that do not report as alive in time (empty when the store cannot be reached)."""
        try:
            store = dist.distributed_c10d._get_default_store()
            prefix = f"lace/alive/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{self.step}/"
            store.set(f"{prefix}{self.context.rank}", "1")
            deadline = time.monotonic() + min(self.timeout, REPORT_SECONDS)
            others = [r for r in range(self.context.world_size) if r != self.context.rank]
            while True:
                missing = [r for r in others if not store.check([f"{prefix}{r}"])]
                if not missing or time.monotonic() >= deadline:
                    return missing
                time.sleep(POLL_SECONDS)
        except Exception:  # noqa: BLE001 - the store lived in the lost process, or is gone with the launcher
            return []
