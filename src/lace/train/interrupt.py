"""Ctrl-C during training: finish the step, save a checkpoint, then stop with `TrainingInterrupted`.

A first SIGINT only asks the run to stop; the loop stops at the next step boundary, where weights,
optimiser, data position and the dictionary pool agree, so the saved checkpoint resumes exactly.
A second SIGINT stops at once (the last periodic checkpoint stays the latest). With several
processes they agree on the step to stop at (a stop asked in any process stops them all).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Self

import torch
import torch.distributed as dist

from lace.distributed import DistributedContext


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after `step`, with its state saved in `checkpoint` (a manifest)."""

    def __init__(self, step: int, checkpoint: Path | None):
        super().__init__(f"training interrupted after step {step}; checkpoint {checkpoint}")
        self.step, self.checkpoint = step, checkpoint


class StopRequest:
    """Context manager catching SIGINT (main thread only) as a request to stop at a step boundary."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("interrupted: finishing this step and saving a checkpoint (Ctrl-C again stops at once)",
              file=sys.stderr, flush=True)

    def agreed(self, context: DistributedContext) -> bool:
        """True when any process was asked to stop (a collective when distributed: call it in every process)."""
        if not context.enabled:
            return self.requested
        flag = torch.tensor([int(self.requested)], device=context.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
