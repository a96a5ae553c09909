"""Stopping a run at a step boundary: Ctrl-C (SIGINT) and a scheduler's preemption notice (SIGTERM, SIGUSR1).

The first signal only asks the run to stop; the loop stops at the next step boundary, where weights,
optimiser, data position and the dictionary pool agree, so the checkpoint written there resumes
exactly. With several processes the request is all-reduced once per step: a signal to any one process
stops them all at the same step, and every process learns what stopped it. Then `TrainingInterrupted`
(Ctrl-C, exit status 130) or `TrainingPreempted` (SIGTERM or SIGUSR1, exit status 75, `EX_TEMPFAIL`:
"preempted, resumable") ends the run.

A second Ctrl-C more than `REPEAT_SECONDS` after the first stops at once (the last periodic checkpoint
stays the latest). A signal repeated sooner, or a SIGTERM / SIGUSR1 after any request, is the same
request passed on again (torchrun forwards the Ctrl-C its workers already had from the terminal, and
sends SIGTERM when a scheduler signals it) and changes nothing.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Self

import torch
import torch.distributed as dist

from lace.distributed import DistributedContext

PREEMPTED_EXIT = 75
"""Exit status of a preempted run (`EX_TEMPFAIL` of sysexits.h): a checkpoint was saved, run it again."""
INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C (128 + SIGINT, as shells report it)."""
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
REPEAT_SECONDS = 1.0
# What a process was asked, as reduced over processes (the larger wins: a preemption outranks Ctrl-C).
NO_STOP, CTRL_C, PREEMPTED = 0, 1, 2


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after `step`, with its state saved in `checkpoint` (a manifest)."""

    exit_code = INTERRUPTED_EXIT
    reason = "interrupted"

    def __init__(self, step: int, checkpoint: Path | None):
        super().__init__(f"training {self.reason} after step {step}; checkpoint {checkpoint}")
        self.step, self.checkpoint = step, checkpoint


class TrainingPreempted(TrainingInterrupted):
    """Training stopped by a preemption notice (SIGTERM or SIGUSR1) after `step`, its state saved."""

    exit_code = PREEMPTED_EXIT
    reason = "preempted"


class StopRequest:
    """Context manager catching SIGINT, SIGTERM and SIGUSR1 (main thread only) as a request to stop at a
    step boundary."""

    def __init__(self):
        self.requested = NO_STOP
        self.agreed_kind = NO_STOP
        self._first_at: float | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, *PREEMPTION_SIGNALS):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.requested:
            if signum == signal.SIGINT and now - self._first_at > REPEAT_SECONDS:
                raise KeyboardInterrupt
            return  # the same request again (forwarded by a launcher, or a scheduler's repeat)
        self.requested, self._first_at = (CTRL_C if signum == signal.SIGINT else PREEMPTED), now
        if signum == signal.SIGINT:
            print("interrupted: finishing this step and saving a checkpoint (Ctrl-C again stops at once)",
                  file=sys.stderr, flush=True)
        else:
            print(f"preempted ({signal.Signals(signum).name}): finishing this step and saving a checkpoint",
                  file=sys.stderr, flush=True)

    def agreed(self, context: DistributedContext) -> bool:
        """True when any process was asked to stop (a collective when distributed: call it in every process)."""
        kind = self.requested
        if context.enabled:
            flag = torch.tensor([kind], device=context.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            kind = int(flag.item())
        self.agreed_kind = kind
        return kind != NO_STOP

    def stopped(self, step: int, checkpoint: Path | None) -> TrainingInterrupted:
        """The exception that ends the run after `agreed` said stop at `step`."""
        kind = TrainingPreempted if self.agreed_kind == PREEMPTED else TrainingInterrupted
        return kind(step, checkpoint)
